/* Prompt text of about N tokens. Real tokenizers give most common English words one token each
 * (with their leading space); the run measures the server's own ratio at start (calibration) and
 * reports the server's usage.prompt_tokens, never this estimate. Words are drawn at random so
 * that prompts share no prefix a server's prefix cache could reuse, unless the run asks for a
 * shared prefix (--shared-prefix-tokens): then every prompt starts with the same words, as chats
 * that share a system prompt do. */
#include "bench_impl.h"

#include <math.h>
#include <string.h>

static const char *const words[] = {
    "the",     "of",       "and",    "to",       "in",     "is",     "that",  "for",     "it",
    "as",      "was",      "with",   "be",       "by",     "on",     "not",   "he",      "this",
    "are",     "or",       "his",    "from",     "at",     "which",  "but",   "have",    "an",
    "had",     "they",     "you",    "were",     "their",  "one",    "all",   "we",      "can",
    "her",     "has",      "there",  "been",     "if",     "more",   "when",  "will",    "would",
    "who",     "so",       "no",     "time",     "people", "year",   "way",   "day",     "man",
    "thing",   "woman",    "life",   "child",    "world",  "school", "state", "family",  "group",
    "country", "problem",  "hand",   "part",     "place",  "case",   "week",  "company", "system",
    "program", "question", "work",   "night",    "point",  "home",   "water", "room",    "mother",
    "area",    "money",    "story",  "fact",     "month",  "lot",    "right", "study",   "book",
    "eye",     "job",      "word",   "business", "issue",  "side",   "kind",  "head",    "house",
    "service", "friend",   "father", "power",    "hour",   "game",   "line",  "end",     "member",
    "law",     "car",      "city",   "name",     "team",   "minute", "idea",  "kid",     "body",
    "back",    "parent",   "face",   "others",   "level",  "office", "door",  "health",  "person",
    "art",     "war",
};

#define N_WORDS (sizeof words / sizeof words[0])

uint32_t sl_bench_prompt_words(const struct sl_bench_calib *k, uint32_t tokens)
{
    double slope = k->slope > 0.05 ? k->slope : 1.0;
    double w = ((double)tokens - k->intercept) / slope;
    if (!(w >= 1))
        return 1;
    if (w > SL_BENCH_LEN_MAX)
        return SL_BENCH_LEN_MAX;
    return (uint32_t)llround(w);
}

void sl_bench_prompt_append(struct sl_str *out, uint32_t n, struct sl_bench_rng *r)
{
    sl_str_reserve(out, (size_t)n * 8);
    for (uint32_t i = 0; i < n; i++) {
        const char *w = words[sl_bench_rng_next(r) % N_WORDS];
        if (i)
            sl_str_append(out, " ", 1);
        sl_str_append(out, w, strlen(w));
    }
}

uint32_t sl_bench_prefix_words(const struct sl_bench_calib *k, uint32_t tokens)
{
    if (tokens == 0)
        return 0;
    double slope = k->prefix_slope > 0.05 ? k->prefix_slope : k->slope > 0.05 ? k->slope : 1.0;
    double w = (double)tokens / slope;
    if (!(w >= 1))
        return 1;
    if (w > SL_BENCH_LEN_MAX)
        return SL_BENCH_LEN_MAX;
    return (uint32_t)llround(w);
}

void sl_bench_prefix_append(struct sl_str *out, uint32_t n, uint64_t seed)
{
    /* A stream label of its own: the requests' words (streams 0x9000 + class) never repeat it. */
    struct sl_bench_rng r;
    sl_bench_rng_seed(&r, seed, 0x5ba7ed);
    sl_bench_prompt_append(out, n, &r);
}
