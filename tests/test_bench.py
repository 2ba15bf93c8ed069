"""`mnnllm bench`: the JSON schema (not the speed), and the table formats."""
import csv
import io
import json
import subprocess
import sys

from mnnllm_core.bench.report import attach_ratios, render
from mnnllm_core.bench.bench_tests import BenchTest, plan
from paths import CONFIG

ROW_KEYS = {"model", "backend", "threads", "test", "samples_ts", "avg_ts", "stddev_ts", "load_s", "peak_rss_mb",
            "device", "placement", "versions", "precision", "n_prompt", "n_gen", "n_depth", "n_kv", "model_size",
            "cold_ts"}


def _bench_json(model, *args: str) -> tuple[list[dict], str]:
    """`mnnllm bench -m MODEL -a cpu ARGS -o json`: its rows and its stderr."""
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "bench", "-m", str(model), "-a", "cpu", *args,
                           "-o", "json"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_bench_json_rows_carry_every_field():
    rows, stderr = _bench_json(CONFIG, "-p", "64", "-n", "16", "-rep", "2")
    assert [r["test"] for r in rows] == ["pp64", "tg16"]
    for row in rows:
        assert ROW_KEYS <= set(row)
        assert row["backend"] == "cpu" and row["threads"] == 2
        assert len(row["samples_ts"]) == 2 and all(s > 0 for s in row["samples_ts"])
        assert abs(row["avg_ts"] - sum(row["samples_ts"]) / 2) < 1e-6
        assert row["cold_ts"] > 0  # the warm-up run, timed apart from the samples
        assert row["placement"]["ops_per_backend"]["cpu"] > 0
        assert row["peak_rss_mb"] > 0 and row["load_s"] > 0 and row["device"]
        assert {"mnnllm", "numpy", "python"} <= set(row["versions"])
    assert "pp64" in stderr or "[1/1]" in stderr  # progress goes to stderr, stdout stays JSON


def _fake_results():
    rows = [{"test": "pp512", "n_prompt": 512, "n_gen": 0, "samples_ts": [100.0, 110.0], "avg_ts": 105.0,
             "stddev_ts": 7.07},
            {"test": "tg128", "n_prompt": 0, "n_gen": 128, "samples_ts": [30.0, 32.0], "avg_ts": 31.0,
             "stddev_ts": 1.41}]
    ours = {"model": "m/config.json", "model_size": 2 ** 20 * 72, "backend": "cpu", "threads": 2, "precision": "low",
            "load_s": 0.8, "peak_rss_mb": 600, "device": "x", "placement": {}, "versions": {},
            "decode_weight_bytes": 2 ** 20 * 500, "rows": rows}
    mnn = {**ours, "backend": "mnn-cpu(low)", "decode_weight_bytes": None,
           "rows": [{**r, "avg_ts": r["avg_ts"] * 2} for r in rows]}
    return ours, mnn


def test_markdown_table_has_llama_bench_columns_and_the_roofline():
    ours, mnn = _fake_results()
    attach_ratios([ours], [mnn])
    text = render([ours, mnn], "md", extra=True)
    assert text.splitlines()[0] == ("| model | modelSize | backend | threads | precision | test | speed(tok/s) | "
                                    "vs MNN | load(s) | peak(MiB) |")
    assert "| pp512 | 105.00 ± 7.07 | 0.50x |" in text
    assert "500.0 MiB of weights per token x 31.0 tok/s" in text


def test_the_first_run_is_a_column_of_its_own_for_the_rows_that_measured_it():
    ours, mnn = _fake_results()
    for row in ours["rows"]:
        row["cold_ts"] = row["avg_ts"] / 10
    text = render([ours, mnn], "md")
    assert text.splitlines()[0].endswith("| speed(tok/s) | cold(tok/s) |")
    assert "| pp512 | 105.00 ± 7.07 | 10.50 |" in text
    mnn_row = next(line for line in text.splitlines() if "mnn-cpu(low)" in line and "pp512" in line)
    assert mnn_row.endswith(" |  |"), "MNN's rows have no first run of ours"


def test_jsonl_and_csv_have_one_row_per_test():
    ours, _ = _fake_results()
    assert [json.loads(line)["test"] for line in render([ours], "jsonl").splitlines()] == ["pp512", "tg128"]
    rows = list(csv.DictReader(io.StringIO(render([ours], "csv"))))
    assert [r["test"] for r in rows] == ["pp512", "tg128"] and rows[0]["samples_ts"] == "100.000;110.000"


def test_test_names_follow_llama_bench():
    assert [t.name for t in plan([512], [128], [(512, 128)])] == ["pp512", "tg128", "pp512+tg128"]
    assert BenchTest(512, 128).tokens == 640


def test_ratios_come_from_mnn_rows_only_and_llama_rows_get_one_too():
    ours, mnn = _fake_results()
    llama = {**ours, "backend": "llama.cpp", "decode_weight_bytes": None,
             "rows": [{**r, "avg_ts": r["avg_ts"] * 4} for r in ours["rows"]]}
    attach_ratios([ours], [mnn, llama])
    assert [r["vs_mnn"] for r in ours["rows"]] == [0.5, 0.5]
    assert [r["vs_mnn"] for r in llama["rows"]] == [2.0, 2.0]
    assert "vs_mnn" not in mnn["rows"][0]


def test_vs_llama_is_skipped_with_a_reason_when_llama_cpp_is_missing(monkeypatch, capsys):
    from mnnllm_core.bench import llama_worker, runner
    monkeypatch.setattr(llama_worker, "available", lambda: (False, "llama-cpp-python is not installed"))
    results, references = runner.run_bench([str(CONFIG)], [], [2], [(8, 0)], 1, 2, False, False,
                                           vs_llama="model.gguf")
    assert results == [] and references == []
    assert "[llama.cpp] skipped: llama-cpp-python is not installed" in capsys.readouterr().err


def test_llama_worker_measures_the_gguf_of_the_default_model():
    import pytest
    pytest.importorskip("llama_cpp")
    from mnnllm_core.export.default_model import default_gguf
    job = {"config": str(CONFIG), "gguf": str(default_gguf()), "threads": 2, "tests": [[8, 0], [0, 4]], "reps": 1}
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.bench.llama_worker"], input=json.dumps(job), text=True,
                          capture_output=True, timeout=300)
    result = json.loads(done.stdout.split("@@BENCH@@", 1)[1])
    assert result["backend"] == "llama.cpp" and [r["test"] for r in result["rows"]] == ["pp8", "tg4"]
    assert all(r["avg_ts"] > 0 for r in result["rows"]) and result["peak_rss_mb"] > 0


def test_memory_modes_run_side_by_side_and_the_roofline_counts_packed_bytes():
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "bench", "-m", str(CONFIG), "-a", "cpu",
                           "-p", "16", "-n", "4", "-rep", "1", "--memory", "low,normal", "-o", "json"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["backend"] for r in rows] == ["cpu(low)", "cpu(low)", "cpu(normal)", "cpu(normal)"]
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "bench", "-m", str(CONFIG), "-a", "cpu",
                           "-p", "0", "-n", "4", "-rep", "1", "--memory", "low,normal"],
                          capture_output=True, text=True, timeout=900)
    low, normal = (float(line.split(": ")[1].split(" MiB")[0]) for line in done.stdout.splitlines()
                   if line.startswith("decode roofline"))
    assert 60 < low < 80 and normal > 6 * low  # int4 + fp16 alphas vs fp32 weights of the same 135M model


def test_a_vision_language_model_gets_a_vision_row_in_images_per_second():
    from vl_reference import FP16, reference
    reference()
    rows, _ = _bench_json(FP16, "-p", "16", "-n", "0", "-rep", "2")
    assert [r["test"] for r in rows] == ["pp16", "vision420x420 img/s"]
    vision = rows[1]
    assert len(vision["samples_ts"]) == 2 and vision["avg_ts"] > 0
    assert abs(vision["mp_s"] - vision["avg_ts"] * 420 * 420 / 1e6) < 1e-9


def test_set_gives_every_run_ours_and_mnns_the_config_keys(tmp_path):
    """`--set use_mmap=true --set tmp_path=DIR`: our worker packs its weights into DIR/packed, MNN's runtime
    writes its own cache file there too."""
    import importlib.util
    import pytest
    if importlib.util.find_spec("MNN") is None:
        pytest.skip("PyPI MNN is not installed")
    rows, _ = _bench_json(CONFIG, "-p", "8", "-n", "0", "-rep", "1", "--vs-mnn", "--set", "use_mmap=true",
                          "--set", f"tmp_path={tmp_path}")
    assert [r["backend"] for r in rows] == ["cpu", "mnn-cpu(low)"]
    assert list((tmp_path / "packed").glob("*/*.pw"))
    assert [p for p in tmp_path.iterdir() if p.name != "packed"]  # MNN's


def test_set_refuses_unknown_keys_and_the_keys_the_bench_sets_itself():
    for item, message in (("thread_num=3", "thread_num is set by the bench itself: use -t"),
                          ("use_mmapp=true", "unknown config key 'use_mmapp'; did you mean use_mmap?")):
        done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "bench", "-m", str(CONFIG), "-p", "8",
                               "-n", "0", "--set", item], capture_output=True, text=True, timeout=300)
        assert done.returncode != 0 and message in done.stderr, done.stderr
        assert "[1/1]" not in done.stderr  # refused before any run


def test_vs_llama_takes_one_gguf_or_one_per_model_and_says_so_before_any_run():
    import pytest
    from mnnllm_core.bench import runner
    from mnnllm_core.errors import ConfigError
    assert runner.llama_pairs(["a", "b"], "x.gguf") == [("a", "x.gguf"), ("b", "x.gguf")]
    assert runner.llama_pairs(["a", "b"], "x.gguf,y.gguf") == [("a", "x.gguf"), ("b", "y.gguf")]
    with pytest.raises(ConfigError, match="3 GGUF files for 2 models"):
        runner.run_bench(["a", "b"], ["cpu"], [2], [(8, 0, 0)], 1, 2, False, False, vs_llama="x,y,z")


def test_an_unknown_llama_kv_type_is_refused_by_name():
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "bench", "-m", str(CONFIG), "--vs-llama",
                           "--llama-kv", "f16,q9"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "'q9'" in done.stderr and "--llama-kv" in done.stderr


def test_the_roofline_line_gives_its_share_of_the_hosts_read_bandwidth():
    ours, mnn = _fake_results()
    ours["host_read_gbs"] = 26.0
    text = render([ours, mnn], "md")
    # 500 MiB x 31 tok/s = 16.25 GB/s, 62.5% of 26
    assert "= 16.25 GB/s, 63% of the 26.00 GB/s this host's memory reads at 2 threads\n" in text + "\n"
    ours.update(host_read_median_gbs=20.0, host_reads=9)
    assert ("= 16.25 GB/s, 63% of the 26.00 GB/s this host's memory reads at 2 threads (the best of 9 reads; "
            "81% of their median, 20.00 GB/s)") in render([ours, mnn], "md")
    del ours["host_read_gbs"]
    assert "this host's memory" not in render([ours], "md")


def test_the_host_is_probed_once_per_thread_count_for_runs_that_read_host_memory(monkeypatch):
    from mnnllm_core.bench import runner
    calls = []

    def fake_worker(module, job, timeout):
        calls.append((module, job["threads"]))
        return {"read_gbs": {str(t): 10.0 * t for t in job["threads"]},
                "median_gbs": {str(t): 9.0 * t for t in job["threads"]}, "rounds": 9, "bytes": 1}

    monkeypatch.setattr(runner, "call_worker", fake_worker)
    ours, _ = _fake_results()
    host = [{**ours, "threads": t, "reads_host_memory": True} for t in (1, 2, 2)]
    device = {**ours, "threads": 4, "reads_host_memory": False}
    prefill_only = {**ours, "threads": 8, "reads_host_memory": True, "rows": ours["rows"][:1]}
    runner.attach_host_bandwidth(host + [device, prefill_only], 60)
    assert calls == [("mnnllm_core.bench.memory_probe", [1, 2])]
    assert [r["host_read_gbs"] for r in host] == [10.0, 20.0, 20.0]
    assert [(r["host_read_median_gbs"], r["host_reads"]) for r in host] == [(9.0, 9), (18.0, 9), (18.0, 9)]
    assert "host_read_gbs" not in device and "host_read_gbs" not in prefill_only
    calls.clear()
    runner.attach_host_bandwidth([device], 60)
    assert calls == []


def test_a_failing_memory_probe_costs_the_roofline_its_share_not_the_runs(monkeypatch, capsys):
    from mnnllm_core.bench import runner
    from mnnllm_core.bench.worker_protocol import WorkerError

    def failing(module, job, timeout):
        raise WorkerError("MemoryError: cannot allocate")

    monkeypatch.setattr(runner, "call_worker", failing)
    ours, _ = _fake_results()
    host = {**ours, "reads_host_memory": True}
    runner.attach_host_bandwidth([host], 60)
    assert "host_read_gbs" not in host
    assert "[memory] no read bandwidth: MemoryError: cannot allocate" in capsys.readouterr().err
    assert "= 16.25 GB/s\n" in render([host], "md") + "\n"


def test_the_memory_probe_reads_a_buffer_bigger_than_the_cache_and_reports_gb_per_second(monkeypatch):
    from mnnllm_core.bench import memory_probe
    monkeypatch.setattr(memory_probe.os, "sysconf", lambda name: 1 << 40 if name == "SC_AVPHYS_PAGES" else 4096)
    for cache, size in ((300 << 20, 1200 << 20), (8 << 20, memory_probe.MIN_BYTES), (1 << 30, memory_probe.MAX_BYTES)):
        monkeypatch.setattr(memory_probe, "last_level_cache_bytes", lambda cache=cache: cache)
        assert memory_probe.buffer_bytes() == size
    monkeypatch.setattr(memory_probe.os, "sysconf", lambda name: 100_000 if name == "SC_AVPHYS_PAGES" else 4096)
    assert memory_probe.buffer_bytes() == 100_000 * 4096 // 4  # a quarter of the free memory at most
    monkeypatch.undo()
    assert memory_probe.last_level_cache_bytes() >= 0
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.bench.memory_probe"],
                          input=json.dumps({"threads": [1, 2]}), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout.split("@@BENCH@@", 1)[1])
    assert set(reply["read_gbs"]) == {"1", "2"} and all(0.1 < v < 10_000 for v in reply["read_gbs"].values())
    assert reply["rounds"] == memory_probe.ROUNDS and set(reply["median_gbs"]) == {"1", "2"}
    assert all(0.1 < reply["median_gbs"][t] <= reply["read_gbs"][t] for t in ("1", "2"))
    assert 16 << 20 <= reply["bytes"] <= memory_probe.MAX_BYTES


def _round_result(backend: str, samples: list[float], load_s: float, peak: float, cold: float) -> dict:
    ours, _ = _fake_results()
    row = {**ours["rows"][0], "samples_ts": samples, "avg_ts": sum(samples) / len(samples), "cold_ts": cold}
    return {**ours, "backend": backend, "load_s": load_s, "peak_rss_mb": peak, "rows": [row]}


def test_rounds_join_their_samples_and_take_the_median_load_and_the_highest_peak():
    from mnnllm_core.bench.rounds import merge_rounds
    rounds = [[_round_result("cpu", [100.0, 110.0], 1.0, 600, 90.0)],
              [_round_result("cpu", [60.0, 70.0], 3.0, 650, 50.0)],
              [_round_result("cpu", [80.0, 80.0], 2.0, 620, 70.0)]]
    [merged] = merge_rounds(rounds)
    row = merged["rows"][0]
    assert row["samples_ts"] == [100.0, 110.0, 60.0, 70.0, 80.0, 80.0]
    assert row["avg_ts"] == 500 / 6 and abs(row["stddev_ts"] - 18.619) < 1e-3 and row["cold_ts"] == 70.0
    assert merged["load_s"] == 2.0 and merged["peak_rss_mb"] == 650 and merged["rounds"] == 3
    assert merge_rounds(rounds[:1]) == rounds[0] and "rounds" not in rounds[0][0]


def test_in_rounds_every_engine_runs_in_turn_and_a_failed_round_keeps_the_finished_ones(monkeypatch):
    from mnnllm_core.bench import runner
    from mnnllm_core.bench.worker_protocol import WorkerError
    calls = []

    def fake_worker(module, job, timeout):
        engine = module.rsplit(".", 1)[1]
        calls.append(engine)
        if engine == "memory_probe":
            return {"read_gbs": {"2": 20.0}, "median_gbs": {"2": 19.0}, "rounds": 9, "bytes": 1}
        if len(calls) > 4:
            raise WorkerError("the third round failed")
        speed = 100.0 * len(calls)
        backend = "mnn-cpu(low)" if engine == "mnn_worker" else "cpu"
        return _round_result(backend, [speed] * job["reps"], 1.0, 600, speed)

    monkeypatch.setattr(runner, "call_worker", fake_worker)
    ours, mnn = runner.run_bench([str(CONFIG)], ["cpu"], [2], [(8, 0)], 2, 2, False, True, rounds=2)
    assert calls == ["mnnllm_worker", "mnn_worker", "mnnllm_worker", "mnn_worker"]  # in turn, not one after the other
    assert ours[0]["rows"][0]["samples_ts"] == [100.0, 100.0, 300.0, 300.0]
    assert mnn[0]["rows"][0]["samples_ts"] == [200.0, 200.0, 400.0, 400.0]
    calls.clear()
    try:
        runner.run_bench([str(CONFIG)], ["cpu"], [2], [(8, 0)], 1, 2, False, True, rounds=3)
    except runner.BenchStopped as stopped:
        assert str(stopped.error) == "the third round failed"
        assert stopped.results[0]["rows"][0]["samples_ts"] == [100.0, 300.0] and stopped.results[0]["rounds"] == 2
        assert stopped.references[0]["rows"][0]["samples_ts"] == [200.0, 400.0]
    else:
        raise AssertionError("the failed round was not reported")


def test_rounds_run_the_real_workers_in_turn():
    rows, stderr = _bench_json(CONFIG, "-p", "16", "-n", "0", "-rep", "1", "--rounds", "2")
    [row] = rows
    assert len(row["samples_ts"]) == 2 and row["rounds"] == 2
    assert "[round 1/2]" in stderr and "[round 2/2]" in stderr


def test_rounds_below_one_are_refused():
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "bench", "-m", str(CONFIG), "--rounds", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--rounds: must be >= 1, got 0" in done.stderr
