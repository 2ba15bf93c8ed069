"""`mnnllm bench -d` (llama-bench's n_depth): every test runs after that many tokens prefilled untimed;
rows carry the depth (`n_depth`; `tg4 @ d64` in markdown) and the KV tokens held after the timed
part (`n_kv`), for ours and MNN's runtime; bad depths are refused before the first run."""
import csv
import io
import json
import subprocess
import sys

import pytest

from mnnllm_core.bench.bench_tests import BenchTest, label, plan
from mnnllm_core.bench.report import attach_ratios, render
from mnnllm_core.bench.worker_protocol import call_worker
from mnnllm_core.cli import main
from paths import CONFIG, linked_model_copy


@pytest.mark.parametrize("value, message", [("-5", "must be >= 0, got -5"), ("1.5", "expected an integer, got '1.5'"),
                                            ("64,x", "expected an integer, got 'x'")])
def test_a_negative_or_non_integer_depth_is_refused(value, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["bench", "-m", str(CONFIG), "-d", value])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (f"error: mnnllm bench: argument -d/--n-depth: {message} "
                                       "(see mnnllm bench --help)\n")


def test_a_depth_beyond_the_models_context_is_refused_before_the_first_run(tmp_path, capsys):
    config = linked_model_copy(tmp_path / "capped", "config.json")
    config.write_text(json.dumps({**json.loads(config.read_text()), "max_all_tokens": 256}))
    assert main(["bench", "-m", str(config), "-a", "cpu", "-d", "0,250", "-p", "16", "-n", "4", "-rep", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "[1/" not in err
    assert err == (f"error: pp16 @ d250 needs 266 tokens of context; the model's max_all_tokens is 256 "
                   f"(file {config}, field -d)\n")


def test_tests_run_at_every_depth_depth_outermost_as_llama_bench_orders_them():
    tests = plan([16], [4], [(8, 2)], [0, 64])
    assert [label(t.name, t.depth) for t in tests] == ["pp16", "tg4", "pp8+tg2", "pp16 @ d64", "tg4 @ d64",
                                                       "pp8+tg2 @ d64"]
    assert [t.context for t in tests] == [16, 5, 10, 80, 69, 74]  # a decode test runs one untimed token first
    assert plan([16], [0], [], None) == [BenchTest(16, 0, 0)]


def test_the_worker_protocol_carries_the_depth_both_ways(tmp_path, monkeypatch):
    (tmp_path / "echo_worker.py").write_text(
        "from mnnllm_core.bench.bench_tests import job_tests, row\n"
        "from mnnllm_core.bench.worker_protocol import worker_main\n"
        "worker_main(lambda job: {'rows': [row(t, [1.0], n_kv=t.context) for t in job_tests(job)]})\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    reply = call_worker("echo_worker", {"config": "c", "backend": "echo", "tests": [[16, 0, 64], [0, 4, 1024], [8, 0]]},
                        timeout=120)
    assert [(r["test"], r["n_prompt"], r["n_gen"], r["n_depth"], r["n_kv"]) for r in reply["rows"]] == [
        ("pp16", 16, 0, 64, 80), ("tg4", 0, 4, 1024, 1029), ("pp8", 8, 0, 0, 8)]


def _results():
    def rows(scale):
        return [{"test": "tg128", "n_prompt": 0, "n_gen": 128, "n_depth": depth, "samples_ts": [s * scale],
                 "avg_ts": s * scale, "stddev_ts": 0.0} for depth, s in ((0, 40.0), (1024, 20.0))]
    ours = {"model": "m/config.json", "model_size": 1 << 20, "backend": "cpu", "threads": 2, "precision": "low",
            "load_s": 1.0, "peak_rss_mb": 1.0, "device": "d", "versions": {}, "decode_weight_bytes": 1 << 20,
            "rows": rows(1.0)}
    mnn = {**ours, "backend": "mnn-cpu(low)", "decode_weight_bytes": None, "rows": rows(4.0)}
    mnn["rows"][1]["avg_ts"] = 10.0  # MNN at depth 1024: 2x ours, where at depth 0 it is 4x
    return ours, mnn


def test_reports_carry_the_depth_and_ratios_compare_rows_of_the_same_depth():
    ours, mnn = _results()
    attach_ratios([ours], [mnn])
    assert [r["vs_mnn"] for r in ours["rows"]] == [0.25, 2.0]
    lines = render([ours, mnn], "md").splitlines()
    assert "| tg128 | 40.00 ± 0.00 | 0.25x |" in lines[2] and "| tg128 @ d1024 | 20.00 ± 0.00 | 2.00x |" in lines[3]
    assert "x 40.0 tok/s" in render([ours], "md")  # the roofline reads the shallowest decode row
    assert [(r["test"], r["n_depth"]) for r in json.loads(render([ours], "json"))] == [("tg128", 0), ("tg128", 1024)]
    assert [json.loads(line)["n_depth"] for line in render([ours], "jsonl").splitlines()] == [0, 1024]
    assert [r["n_depth"] for r in csv.DictReader(io.StringIO(render([ours], "csv")))] == ["0", "1024"]


def test_ours_and_mnns_rows_at_depth_64_held_the_depth_in_the_kv_cache():
    pytest.importorskip("MNN", reason="PyPI MNN (the reference runtime) is not installed")
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "bench", "-m", str(CONFIG), "-a", "cpu",
                           "-d", "0,64", "-p", "16", "-n", "4", "-rep", "1", "--vs-mnn", "-o", "json"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["backend"], r["test"], r["n_depth"]) for r in rows] == [
        (backend, test, depth) for backend in ("cpu", "mnn-cpu(low)") for depth in (0, 64) for test in ("pp16", "tg4")]
    for row in rows:
        timed = row["n_prompt"] + row["n_gen"]
        # n_kv: the tokens the KV cache held after the timed part (a decode test adds its untimed first
        # token, MNN's generate one more); the depth-64 rows' caches held the 64 depth tokens as well
        assert row["n_depth"] + timed <= row["n_kv"] <= row["n_depth"] + timed + 2, row
        assert row["avg_ts"] > 0
    assert all("vs_mnn" in r for r in rows if r["backend"] == "cpu")


def test_llama_worker_runs_a_test_at_a_depth():
    pytest.importorskip("llama_cpp")
    from mnnllm_core.export.default_model import default_gguf
    job = {"config": str(CONFIG), "gguf": str(default_gguf()), "threads": 2, "tests": [[8, 0, 32], [0, 4, 32]],
           "reps": 1}
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.bench.llama_worker"], input=json.dumps(job), text=True,
                          capture_output=True, timeout=300)
    result = json.loads(done.stdout.split("@@BENCH@@", 1)[1])
    assert [(r["test"], r["n_depth"]) for r in result["rows"]] == [("pp8", 32), ("tg4", 32)]
    assert [r["n_kv"] for r in result["rows"]] == [40, 37]
