"""Progress bars appear on terminals only, after their delay, and end with a newline."""
import io

from mnnllm_core.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_is_drawn_on_a_terminal_and_closed_with_a_newline():
    stream = Terminal()
    bar = Progress(4, "export", unit="M params", scale=1e6, stream=stream)
    bar.update(2_000_000)
    bar.close()
    text = stream.getvalue()
    assert "export" in text and "|" in text and text.endswith("\n")


def test_nothing_is_drawn_on_a_pipe_or_before_the_delay():
    pipe = io.StringIO()
    bar = Progress(10, "load", stream=pipe)
    bar.update(10)
    bar.close()
    assert pipe.getvalue() == ""
    stream = Terminal()
    quick = Progress(10, "packing", stream=stream, delay=60.0)
    quick.update(10)
    quick.close()
    assert stream.getvalue() == ""


def test_the_bar_says_how_long_is_left_at_the_rate_since_its_last_draw(monkeypatch):
    clock = iter([0.0, 60.0, 61.0, 62.0])
    monkeypatch.setattr("mnnllm_core.progress.time.perf_counter", lambda: next(clock))
    stream = Terminal()
    bar = Progress(10, "packing", unit=" ops", stream=stream)
    bar.update(1)  # a slow first op (60 s): no estimate yet
    assert stream.getvalue().rstrip().endswith("1/10 ops 60.0s")
    bar.update(2)  # 2 ops in the last second: 7 left, ~4 s
    assert "3/10 ops 61.0s, ~4s left" in stream.getvalue()
    bar.update(7)
    assert stream.getvalue().rstrip().endswith("10/10 ops 62.0s")
