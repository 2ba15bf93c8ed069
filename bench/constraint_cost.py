"""What a JSON-schema constraint costs while decoding: mask time per token and decode tok/s with
and without the schema, side by side in one process on one model (greedy, the same prompt; the
runs alternate so the machine's load falls on both alike). Decode time here is the model's
forward plus sampling (where the mask is computed and applied), per generated token after the first.

Run: .venv/bin/python bench/constraint_cost.py [config.json] [--tokens 96] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics

import mnnllm_core
from mnnllm_core.llm.constraint import Constraint

SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "minItems": 20, "maxItems": 40, "items": {
    "type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 16}},
    "required": ["id", "name"], "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False}
PROMPT = "List products with ids and names as JSON."


def one_run(llm, tokens: int, constraint: Constraint | None) -> tuple[float, list[float], int]:
    """(decode tok/s, mask us of each token, tokens) of one reply of `tokens` tokens."""
    llm.reset()
    ids = llm.tokenizer_encode(llm.apply_chat_template(PROMPT))
    sampler = llm.guide(constraint) if constraint is not None else None
    out = llm.generate(ids, tokens, sampler)
    ctx = llm.context
    steps = max(len(out) - 1, 1)
    seconds = (ctx.decode_us + ctx.sample_us) / 1e6
    return steps / seconds, sampler.mask_times_us if sampler is not None else [], len(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", nargs="?", default="../shared/models/smollm2-135m-instruct-mnn-q4/config.json")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    llm = mnnllm_core.create(args.config)
    llm.set_config({"sampler_type": "greedy"})
    llm.load()
    schema = Constraint.json_schema(SCHEMA)
    one_run(llm, 8, None)
    one_run(llm, 8, schema)  # warm both paths (the vocabulary for llguidance is built once here)
    plain, guided, masks = [], [], []
    for _ in range(args.rounds):
        speed, _, n_plain = one_run(llm, args.tokens, None)
        plain.append(speed)
        speed, mask, n_guided = one_run(llm, args.tokens, schema)
        guided.append(speed)
        masks += mask
    p, g = statistics.median(plain), statistics.median(guided)
    print(f"decode without schema: {p:.1f} tok/s ({n_plain} tokens, median of {args.rounds})")
    print(f"decode with schema:    {g:.1f} tok/s ({n_guided} tokens), ratio {g / p:.3f}")
    print(f"mask per token:        median {statistics.median(masks):.0f} us, mean {statistics.mean(masks):.0f} us "
          f"(computed by llguidance and applied; the mean holds each reply's first mask, built lazily)")


if __name__ == "__main__":
    main()
