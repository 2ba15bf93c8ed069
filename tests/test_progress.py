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


def test_the_bar_says_how_long_is_left_at_the_rate_so_far(monkeypatch):
    clock = iter([0.0, 10.0, 20.0])
    monkeypatch.setattr("mnnllm_core.progress.time.perf_counter", lambda: next(clock))
    stream = Terminal()
    bar = Progress(4, "packing", unit=" ops", stream=stream)
    bar.update(1)  # 1 of 4 in 10 s: 30 s left
    assert "1/4 ops 10.0s, ~30s left" in stream.getvalue()
    bar.update(3)
    assert stream.getvalue().rstrip().endswith("4/4 ops 20.0s")
