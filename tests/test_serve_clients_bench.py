"""bench/serve_clients_bench.py's pieces that decide what it prints: every client asks its own
question, and each percentile is the tail that matters (the slow end of a time and of a rate)."""
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench():
    sys.path.insert(0, str(BENCH))  # the script imports serve_bench beside it
    try:
        import serve_clients_bench
    finally:
        sys.path.remove(str(BENCH))
    return serve_clients_bench


def test_every_client_asks_its_own_question():
    for count in (4, 16, 40):
        assert len(set(bench().questions(count))) == count


def test_percentiles_take_the_slow_tail_of_times_and_of_rates():
    values = np.arange(1, 101, dtype=float)  # 1 .. 100
    cells = bench().cells
    assert cells(values, 2) == " | ".join(f"{np.percentile(values, q):.2f}" for q in (50, 90, 99))
    rates = [float(x) for x in cells(values, 2, higher_better=True).split(" | ")]
    assert rates == [np.percentile(values, 50), np.percentile(values, 10), np.percentile(values, 1)]
    assert rates[0] > rates[1] > rates[2]  # p90 of a rate: 90 % of streams at least this fast
