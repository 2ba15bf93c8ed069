"""MNN's own runtime (PyPI MNN 3.6.1, built with vision) on the shared tiny Qwen2-VL, in a
subprocess: greedy ids for already templated prompts with <img> tags (use_template off)."""
from __future__ import annotations

import textwrap

from mnn_oracle import run_script

# The model loaded greedily at memory "normal", templates off; `job["extra"]` adds config keys.
LOAD = textwrap.dedent("""
    import json, os, sys, tempfile
    import MNN.llm as llm
    job = json.load(sys.stdin)
    config = json.load(open(os.path.join(job["model_dir"], "config.json")))
    config.update({"base_dir": job["model_dir"].rstrip("/") + "/", "memory": "normal", "sampler_type": "greedy",
                   "use_template": False, **job["extra"]})
    path = os.path.join(tempfile.mkdtemp(), "config.json")
    json.dump(config, open(path, "w"))
    m = llm.create(path)
    m.load()
""")
SCRIPT = LOAD + textwrap.dedent("""
    out = []
    for text in job["prompts"]:
        m.response(text)
        out.append({"prompt_len": m.context.prompt_len, "ids": list(m.context.output_tokens)})
    print("@@RESULT@@" + json.dumps(out), flush=True)
    os._exit(0)  # MNN 3.6.1 can crash in its destructors at interpreter exit
""")


def mnn_vision_ids(model_dir, prompts: list[str], new_tokens: int, timeout: float = 300) -> list[dict]:
    return run_script(SCRIPT, {"model_dir": str(model_dir), "prompts": prompts,
                               "extra": {"max_new_tokens": new_tokens}}, timeout)


ENCODE_SCRIPT = LOAD + textwrap.dedent("""
    out = []
    for text in job["prompts"]:
        m.reset()
        ids = list(m.tokenizer_encode(text))
        out.append({"prompt_ids": ids, "ids": list(m._c_obj.generate(ids, job["new_tokens"]))})
    print("@@RESULT@@" + json.dumps(out), flush=True)
    os._exit(0)
""")


def mnn_encode_generate(model_dir, prompts: list[str], new_tokens: int, timeout: float = 300) -> list[dict]:
    """MNN's prompt ids (tokenizer_encode runs the vision encoder) and greedy ids from them; unlike
    response(), nothing decodes the answer to text (a random model's bytes may be no UTF-8)."""
    return run_script(ENCODE_SCRIPT, {"model_dir": str(model_dir), "prompts": prompts, "new_tokens": new_tokens,
                                      "extra": {}}, timeout)
