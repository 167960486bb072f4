"""The flags of ``provmark generate``, one table per family: the parser (``api.cli.generate``) and the
run (``api.cli.generate_run``) both read them, so a flag and the field it sets are written once."""

from __future__ import annotations

# (flag, SamplingParams field, type, help); every sampler option of the engine
SAMPLER_OPTIONS = [
    ("--max-new-tokens", "max_new_tokens", int, "tokens to generate at most (default 128)"),
    ("--min-new-tokens", "min_new_tokens", int, "suppress end-of-text before this many tokens"),
    ("--temperature", "temperature", float, "0 = greedy (default 1.0)"),
    ("--top-k", "top_k", int, "keep the k most likely tokens (0 = off)"),
    ("--top-p", "top_p", float, "nucleus sampling mass (1 = off)"),
    ("--min-p", "min_p", float, "drop tokens below min_p x the top probability"),
    ("--typical-p", "typical_p", float, "locally typical sampling mass (1 = off)"),
    ("--epsilon-cutoff", "epsilon_cutoff", float, "truncation sampling: drop p < epsilon"),
    ("--eta-cutoff", "eta_cutoff", float, "eta sampling (entropy-dependent cut-off)"),
    ("--mirostat", "mirostat_mode", int, "mirostat version: 0 off, 1, 2"),
    ("--mirostat-tau", "mirostat_tau", float, "mirostat target surprise (bits)"),
    ("--mirostat-eta", "mirostat_eta", float, "mirostat learning rate"),
    ("--repetition-penalty", "repetition_penalty", float, "CTRL-style penalty (1 = off)"),
    ("--presence-penalty", "presence_penalty", float, "OpenAI-style presence penalty"),
    ("--frequency-penalty", "frequency_penalty", float, "OpenAI-style frequency penalty"),
    ("--no-repeat-ngram-size", "no_repeat_ngram_size", int, "ban repeating n-grams of this size"),
    ("--seed", "seed", int, "seed: the same seed gives the same tokens"),
    ("--logprobs", "logprobs", int, "report the chosen token's logprob and this many top ones"),
]


EARLY_STOPPING_CHOICES = {"true": True, "false": False, "never": "never"}
SPECULATIVE_METHODS = {"prompt-lookup": "prompt_lookup", "draft": "draft"}

# (flag, method config, config field, type, help): the one mapping from decoding flags to config fields.
# The first row of each method is its switch: the method's other flags need it.
DECODING_OPTIONS = [
    ("--num-beams", "beam", "num_beams", int, "beam search with this many beams"),
    ("--length-penalty", "beam", "length_penalty", float, "beam score = logprob sum / length ** this (default 1.0)"),
    ("--early-stopping", "beam", "early_stopping", EARLY_STOPPING_CHOICES.get,
     "true: stop once num-beams beams finished; false (default): when none can improve (heuristic); never: exact"),
    ("--speculative", "speculative", "method", SPECULATIVE_METHODS.get, "speculative decoding drafter"),
    ("--num-speculative-tokens", "speculative", "num_speculative_tokens", int, "tokens drafted per target forward"),
    ("--prompt-lookup-max", "speculative", "prompt_lookup_max", int, "prompt lookup: longest n-gram matched"),
    ("--prompt-lookup-min", "speculative", "prompt_lookup_min", int, "prompt lookup: shortest n-gram matched"),
    ("--draft-model", "speculative", "draft_model", str, "draft model folder sharing the tokenizer ('default' = embedded)"),
    ("--contrastive-amateur", "contrastive", "amateur_model", str, "contrastive decoding against this amateur model folder"),
    ("--contrastive-alpha", "contrastive", "alpha", float, "plausibility cut-off: fraction of the expert's top probability"),
    ("--contrastive-beta", "contrastive", "beta", float, "weight of the amateur's log-probabilities"),
    ("--mbr", "mbr", "num_candidates", int, "minimum Bayes risk decoding over this many sampled candidates"),
    ("--mbr-similarity", "mbr", "similarity", str, "MBR similarity: chrf (default) or token_f1"),
]
DECODING_CHOICES = {"--early-stopping": list(EARLY_STOPPING_CHOICES), "--speculative": list(SPECULATIVE_METHODS)}
DECODING_METAVARS = {"--draft-model": "DIR", "--contrastive-amateur": "DIR", "--mbr-similarity": "NAME"}
CONFIG_CLASSES = {"beam": "BeamConfig", "speculative": "SpeculativeConfig", "contrastive": "ContrastiveConfig",
                  "mbr": "MBRConfig"}
# the module each method's config class lives in, imported only when that method is asked for
CONFIG_MODULES = {"beam": "generation.decoding.beam", "speculative": "generation.decoding.speculative.decode",
                  "contrastive": "generation.decoding.contrastive", "mbr": "generation.decoding.mbr"}


def _dest(flag: str) -> str:
    return "decoding_" + flag.lstrip("-").replace("-", "_")
