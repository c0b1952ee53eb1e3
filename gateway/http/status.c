/* Status mapping: the one place where sluice's statuses become HTTP codes, and the reason
 * phrases of the codes sluice sends. */
#include "http_impl.h"

int sl_http_status_code(int status)
{
    switch (status) {
    case SL_OK: return 200;
    case SL_EINVAL:
    case SL_EFORMAT:
    case SL_ERANGE: return 400;
    case SL_EPERM: return 403;
    case SL_ENOENT: return 404;
    case SL_EAGAIN:
    case SL_EBUSY:
    case SL_ENOMEM:
    case SL_ECANCELED: return 503; /* over capacity, or the engine is shutting down */
    case SL_ETIMEDOUT: return 504;
    case SL_EIO:
    case SL_EBACKEND:
    default: return 500;
    }
}

const char *sl_http_reason_phrase(int code)
{
    switch (code) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    }
    return "Unknown";
}
