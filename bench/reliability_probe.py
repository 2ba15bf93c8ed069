"""The reliability probe: hostile inputs to the CLI and the API, each in its own
process under a timeout, sorted into clean / traceback / hang / crash / silent per class.

clean: a one-line typed error (exit 2, "error: ...", no traceback, at most 300 characters)
where an error is due, or the right answer where one is. traceback: an exception that is not
one of the project's. hang: past the timeout. crash: killed by a signal. silent: exit 0 with
a wrong answer, or no error where one was due.

    .venv/bin/python bench/reliability_probe.py [--only CLASS] [--timeout 180]

Needs the shared model (../shared, or MNNLLM_SHARED) and runs about one model load per case.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MNNLLM_SHARED", ROOT.parent / "shared"))
MODEL = SHARED / "models" / "smollm2-135m-instruct-mnn-q4"
QUESTION, ANSWER = "What is the capital of France?", "The capital of France is Paris."
RESULTS = ("clean", "traceback", "hang", "crash", "silent")


@dataclass
class Case:
    kind: str  # the class of the list
    name: str
    argv: list[str] | None = None  # a CLI run: "{model}" stands for the edited model's config
    edit: Callable[[Path], None] | None = None  # changes the model's copy first
    code: str | None = None  # or Python with `llm` (the loaded model) that prints OK when right
    expect: str = "error"  # "error", or the text the answer must contain
    stdin: str = ""
    files: dict = field(default_factory=dict)


def llm_config(**changes) -> Callable[[Path], None]:
    return lambda folder: _update(folder / "llm_config.json", changes)


def config(**changes) -> Callable[[Path], None]:
    return lambda folder: _update(folder / "config.json", changes)


def _update(path: Path, changes: dict) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        target = data
        *parents, last = key.split(".")
        for part in parents:
            target = target[part]
        target[last] = value
    path.write_text(json.dumps(data))


def raw_config(text: str) -> Callable[[Path], None]:
    return lambda folder: (folder / "config.json").write_text(text)


def fifo_tokenizer(folder: Path) -> None:
    os.mkfifo(folder / "fifo")
    _update(folder / "config.json", {"tokenizer_file": "fifo"})


def negative_const(folder: Path) -> None:
    import flatbuffers
    import numpy as np

    from mnnllm_core.schema.reader import op_type_name, read_net
    net = read_net((folder / "llm.mnn").read_bytes(), "llm.mnn")
    shapes = [op for op in net.oplists if op_type_name(op.type) == "Const" and op.main is not None
              and op.main.dims is not None and len(op.main.dims) == 1 and op.main.int32s is not None
              and len(op.main.int32s) == 3]
    for op in shapes:
        op.main.int32s = -np.abs(np.asarray(op.main.int32s)) - 7
    builder = flatbuffers.Builder(1 << 20)
    builder.Finish(net.Pack(builder))
    (folder / "llm.mnn").write_bytes(bytes(builder.Output()))


TESTS = str(ROOT / "tests")
TINY = textwrap.dedent(f"""
    import sys; sys.path.insert(0, {TESTS!r})
    from pathlib import Path
    import mnnllm_core
    from mnnllm_core.export import export_model
    from test_export import random_weights, write_hf_folder
    src = write_hf_folder(Path('hf'), 'llama', random_weights('llama', True), True)
""")
CACHE = textwrap.dedent(f"""
    import sys; sys.path.insert(0, {TESTS!r})
    from pathlib import Path
    import mnnllm_core
    from mnnllm_core.export import default_model
    from test_export import random_weights, write_gguf
    TESTS = {TESTS!r}
    write_gguf(Path('tiny.gguf'), random_weights('llama', True))
    default_model.default_gguf = lambda: Path('tiny.gguf')
    def answer():
        llm = mnnllm_core.create(default_model.ensure_default_model('cache')).load()
        return llm.generate(llm.tokenizer_encode('hi'), 4)
    first = answer()
    folder = default_model.default_model_folder('cache')
""")
RUN = ["run", "{model}", "--set", "sampler_type=greedy", "--max-new-tokens", "12", "-p"]
HUGE = "x" * 100_000
UP = "../" * 20  # as a hostile config reaches out of its folder
LOAD = "import mnnllm_core\nllm = mnnllm_core.create({model!r}); llm.set_config({'sampler_type': 'greedy'}); llm.load()\n"
STATE = LOAD + "Q = " + repr(QUESTION) + "\nA = " + repr(ANSWER) + "\n"

CASES = [
    # 1-2: state
    Case("1 reset", "two /reset then a question", ["chat", "{model}", "--set", "sampler_type=greedy",
         "--max-new-tokens", "12"], stdin=f"Tell me about cats.\n/reset\n/reset\n{QUESTION}\n", expect="Paris"),
    Case("1 reset", "a failed request then reset", code=STATE + textwrap.dedent("""
        try: llm.generate(list(range(3000)), 2)
        except mnnllm_core.MnnllmError: pass
        llm.reset(); assert llm.response(Q) == A; print('OK')""")),
    Case("2 concurrency", "two live streams", code=STATE + textwrap.dedent("""
        from mnnllm_core.errors import ConcurrentUseError
        a = llm.response(Q, stream=True); b = llm.response('Tell me about cats.', stream=True)
        next(a); next(b)
        try: next(a); raise SystemExit('the superseded stream went on')
        except ConcurrentUseError: pass
        llm.reset(); assert llm.response(Q) == A; print('OK')""")),
    Case("2 concurrency", "four threads on one Llm", code=STATE + textwrap.dedent("""
        import threading
        from mnnllm_core.errors import ConcurrentUseError
        out = []
        def ask():
            try: out.append(llm.response(Q))
            except ConcurrentUseError: out.append(None)
        ts = [threading.Thread(target=ask) for _ in range(4)]
        [t.start() for t in ts]; [t.join() for t in ts]
        assert all(o in (A, None) for o in out), out
        llm.reset(); assert llm.response(Q) == A; print('OK')""")),
    # 3: chat template
    Case("3 template", "'A' * 10**9", RUN + [QUESTION], llm_config(**{"jinja.chat_template": "{{ 'A' * 10**9 }}"})),
    Case("3 template", "'A' * 10**8", RUN + [QUESTION], llm_config(**{"jinja.chat_template": "{{ 'A' * 10**8 }}"})),
    Case("3 template", "nested range(100000) loops", RUN + [QUESTION], llm_config(**{
        "jinja.chat_template": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"})),
    Case("3 template", "syntax error", RUN + [QUESTION], llm_config(**{"jinja.chat_template": "{% for %}"})),
    Case("3 template", "raise_exception", RUN + [QUESTION],
         llm_config(**{"jinja.chat_template": "{{ raise_exception('no system role') }}"})),
    # 4: file reads
    Case("4 files", "tokenizer_file /dev/zero", RUN + [QUESTION], config(tokenizer_file=UP + "dev/zero")),
    Case("4 files", "llm_model /dev/zero", RUN + [QUESTION], config(llm_model=UP + "dev/zero")),
    Case("4 files", "tokenizer_file a FIFO", RUN + [QUESTION], fifo_tokenizer),
    Case("4 files", "tokenizer_file /etc/passwd", RUN + [QUESTION], config(tokenizer_file=UP + "etc/passwd")),
    Case("4 files", "llm_config /dev/zero", RUN + [QUESTION], config(llm_config=UP + "dev/zero")),
    Case("4 files", "embedding_file a folder", RUN + [QUESTION], config(embedding_file=UP + "tmp")),
    # 5: export
    Case("5 export", "onto a file", code=TINY + textwrap.dedent("""
        Path('dst').write_text('x')
        try: export_model(str(src), 'dst', quant_bit=8)
        except mnnllm_core.MnnllmError: print('OK')""")),
    Case("5 export", "over a model without --force", code=TINY + textwrap.dedent("""
        export_model(str(src), 'dst', quant_bit=8)
        try: export_model(str(src), 'dst', quant_bit=4); raise SystemExit('overwritten')
        except mnnllm_core.MnnllmError: print('OK')""")),
    Case("5 export", "--force leaves no stale embeddings", code=TINY + textwrap.dedent("""
        export_model(str(src), 'dst', quant_bit=8, separate_embed=True)
        export_model(str(src), 'dst', quant_bit=8, force=True)
        assert not Path('dst/embeddings_bf16.bin').exists(); print('OK')""")),
    Case("5 export", "SIGINT during the weight write", code=TINY + textwrap.dedent("""
        from mnnllm_core.export import exporter
        export_model(str(src), 'dst', quant_bit=8)
        before = {p.name: p.read_bytes() for p in Path('dst').iterdir()}
        def interrupted(*a, **k): raise KeyboardInterrupt
        exporter.write_mtok = interrupted
        try: export_model(str(src), 'dst', quant_bit=4, force=True)
        except KeyboardInterrupt: pass
        assert {p.name: p.read_bytes() for p in Path('dst').iterdir()} == before
        assert sorted(p.name for p in Path('.').iterdir() if p.name.startswith('.')) == []; print('OK')""")),
    # 6: the default-model cache
    Case("6 cache", "a truncated weight file", code=CACHE + textwrap.dedent("""
        w = folder / 'llm.mnn.weight'; w.write_bytes(w.read_bytes()[:1000])
        assert answer() == first; print('OK')""")),
    Case("6 cache", "flipped bytes", code=CACHE + textwrap.dedent("""
        w = folder / 'llm.mnn.weight'; d = bytearray(w.read_bytes()); d[5000:5100] = bytes(100); w.write_bytes(d)
        assert answer() == first; print('OK')""")),
    Case("6 cache", "kill -9 during the first export", code=CACHE + textwrap.dedent("""
        import os, shutil, subprocess, sys
        shutil.rmtree(folder)
        kill = ("import os, signal, sys; sys.path.insert(0, %r)\\n" % TESTS +
                "from pathlib import Path\\nfrom mnnllm_core.export import default_model\\n"
                "real = default_model.write_model\\n"
                "def export(src, dst, **kw):\\n    (Path(dst) / 'llm.mnn').write_bytes(b'half'); os.kill(os.getpid(), 9)\\n"
                "default_model.default_gguf = lambda: Path('tiny.gguf')\\ndefault_model.write_model = export\\n"
                "default_model.ensure_default_model('cache')\\n")
        assert subprocess.run([sys.executable, '-c', kill]).returncode == -9
        assert answer() == first
        assert [p.name for p in Path('cache/models').iterdir()] == [folder.name]; print('OK')""")),
    # 7: tracebacks
    Case("7 tracebacks", "deeply nested JSON", RUN + [QUESTION], raw_config('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")),
    Case("7 tracebacks", "prompt b'\\xff'", RUN + ["\udcff"]),
    Case("7 tracebacks", "a '\\ud800' path", RUN + [QUESTION], raw_config('{"tokenizer_file": "\\ud800"}')),
    Case("7 tracebacks", "hidden_size 0", RUN + [QUESTION], llm_config(hidden_size=0)),
    Case("7 tracebacks", "negative Const shapes in the graph", RUN + [QUESTION], negative_const),
    Case("7 tracebacks", "tokenizer_decode([-1])", code=LOAD + textwrap.dedent("""
        try: llm.tokenizer_decode([-1])
        except mnnllm_core.MnnllmError: print('OK')""")),
    # 8: numbers
    Case("8 numbers", "quant_block 0", RUN + [QUESTION], llm_config(**{"tie_embeddings.quant_block": 0})),
    Case("8 numbers", "quant_block 1e-320", RUN + [QUESTION], llm_config(**{"tie_embeddings.quant_block": 1e-320})),
    Case("8 numbers", "weight_offset 1.5", RUN + [QUESTION], llm_config(**{"tie_embeddings.weight_offset": 60005410.5})),
    Case("8 numbers", "attention_mask 'banana'", RUN + [QUESTION], llm_config(attention_mask="banana")),
    Case("8 numbers", "a 100 KB bad value", RUN + [QUESTION], config(thread_num=HUGE)),
    Case("8 numbers", "max_new_tokens 0 / -5 / 2.7 / '5'", code=LOAD + textwrap.dedent("""
        ids = llm.tokenizer_encode(llm.apply_chat_template('Hi'))
        for bad in (0, -5, 2.7, '5', True):
            try: llm.generate(ids, bad); raise SystemExit(f'{bad!r} accepted')
            except mnnllm_core.MnnllmError: pass
        print('OK')""")),
    Case("8 numbers", "2040-token prompt + 100 new", code=LOAD + textwrap.dedent("""
        from mnnllm_core.llm.context import CONTEXT_FULL
        llm.generate([28] * 2040, 100)
        assert llm.context.status == CONTEXT_FULL, llm.context.status; print('OK')""")),
    Case("8 numbers", "a 1 MB prompt", code=LOAD + textwrap.dedent("""
        import time
        start = time.perf_counter()
        try: llm.response('cat ' * 250_000); raise SystemExit('accepted')
        except mnnllm_core.errors.ContextLengthError: pass
        assert time.perf_counter() - start < 5, time.perf_counter() - start; print('OK')""")),
    # exporter: round 2 (issue 29 item 5)
    Case("exporter", "export SRC SRC --force", code=TINY + textwrap.dedent("""
        import subprocess, sys
        before = {p.name: p.read_bytes() for p in src.iterdir()}
        done = subprocess.run([sys.executable, '-m', 'mnnllm_core.cli', 'export', str(src), str(src), '--force',
                               '--quant-bit', '8'], capture_output=True, text=True)
        assert done.returncode == 2 and 'field dst' in done.stderr, (done.returncode, done.stderr[-300:])
        assert {p.name: p.read_bytes() for p in src.iterdir()} == before; print('OK')""")),
    Case("exporter", "DST inside SRC, SRC inside DST, DST a symlink to SRC", code=TINY + textwrap.dedent("""
        import shutil
        from mnnllm_core.errors import ConfigError
        shutil.copytree(src, 'outer/hf')
        Path('link').symlink_to(src.resolve(), target_is_directory=True)
        before = {p.name: p.read_bytes() for p in src.iterdir()}
        for s, d in ((src, src / 'out'), (Path('outer/hf'), Path('outer')), (src, Path('link'))):
            try: export_model(str(s), str(d), quant_bit=8, force=True); raise SystemExit(f'{s} -> {d} exported')
            except ConfigError as exc: assert exc.field == 'dst', exc
        assert Path('outer/hf/config.json').exists()
        assert {p.name: p.read_bytes() for p in src.iterdir()} == before; print('OK')""")),
    Case("exporter", "kill -9 mid-export, then export again", code=TINY + textwrap.dedent("""
        import subprocess, sys
        kill = ("import os; from pathlib import Path\\nfrom mnnllm_core.export import exporter\\n"
                "def half(src, out, *a, **k):\\n    (Path(out) / 'llm.mnn.weight').write_bytes(bytes(1 << 20))\\n"
                "    os.kill(os.getpid(), 9)\\nexporter.write_model = half\\n"
                "exporter.export_model('hf', 'dst', quant_bit=8)\\n")
        assert subprocess.run([sys.executable, '-c', kill]).returncode == -9
        assert [p.name for p in Path('.').iterdir() if p.name.startswith('.dst-')], 'no staging folder left to clean'
        export_model(str(src), 'dst', quant_bit=8)
        assert [p.name for p in Path('.').iterdir() if p.name.startswith('.dst')] == []; print('OK')""")),
    Case("exporter", "a transposed embedding, a norm of the embedding's shape", code=TINY + textwrap.dedent("""
        from mnnllm_core.errors import FormatError
        for name in ('model.embed_tokens.weight', 'model.layers.0.input_layernorm.weight'):
            w = random_weights('llama', True)
            embedding = w['model.embed_tokens.weight']
            w[name] = embedding.T.copy() if name.startswith('model.embed') else embedding.copy()
            bad = write_hf_folder(Path('bad-' + name), 'llama', w, True)
            try: export_model(str(bad), 'dst-' + name, quant_bit=8); raise SystemExit(f'{name} exported')
            except FormatError as exc: assert name in str(exc), exc
        print('OK')""")),
    Case("exporter", "a safetensors header 100,000 deep", code=TINY + textwrap.dedent("""
        import struct
        from mnnllm_core.errors import FormatError
        head = ('{"a": ' + '[' * 100_000 + ']' * 100_000 + '}').encode()
        (src / 'model-00001-of-00002.safetensors').write_bytes(struct.pack('<Q', len(head)) + head)
        try: export_model(str(src), 'dst', quant_bit=8); raise SystemExit('exported')
        except FormatError as exc: assert 'safetensors' in str(exc), exc
        print('OK')""")),
]

# disk caches (issue 29, 1-4): a cache file changed after it was written is refused with a warning,
# made again, and the answer is the uncached one; a pack another process maps stays valid when
# another load writes it again (a truncation in place by anything else is a SIGBUS: not probed)
PACKS = textwrap.dedent("""
    import json, shutil, struct
    from pathlib import Path
    import mnnllm_core
    OP = '/layers.0/self_attn/q_proj/Linear'
    def answer():
        llm = mnnllm_core.create({model!r})
        llm.set_config({'sampler_type': 'greedy', 'use_mmap': True, 'tmp_path': 'packs'}); llm.load()
        return llm.generate(llm.tokenizer_encode('Hi'), 8), llm.runtime_manager.runtime.weight_cache
    first, _ = answer()
    def header(data):
        start = data.index(b'{"name"')
        return start, data[start:start + struct.unpack_from('<I', data, 8)[0]].decode()
    path = next(p for p in Path('packs').rglob('*.pw') if json.loads(header(p.read_bytes())[1])['name'].endswith(OP))
    data = bytearray(path.read_bytes())
    start, text = header(data)
    arrays = {a['key']: a for a in json.loads(text)['arrays']}
    def edit_header(old, new):
        path.write_bytes(data[:start] + text.replace(old, new, 1).encode() + data[start + len(text):])
    def repacked():
        again, cache = answer()  # a wrong answer prints no OK: silent
        print('OK' if again == first and (cache.misses, cache.hits) == (1, 210) else (again, first, cache.misses))
""")
KV = LOAD + textwrap.dedent("""
    import json, struct
    from pathlib import Path
    ids = [llm.tokenizer_encode(llm.apply_chat_template(f'When does the museum {w}? Answer in a sentence.'))
           for w in ('open', 'close')]
    assert len(ids[0]) == len(ids[1]) and ids[0] != ids[1]
    expected = llm.generate(ids[1], 8)
    cached = mnnllm_core.create({model!r}); cached.set_config({'sampler_type': 'greedy', 'prefix_cache_path': 'kv'})
    cached.load(); cached.generate(ids[0], 8); cached.reset()
    (path,) = Path('kv').rglob('*.kv')
""")
CASES += [
    Case("disk caches", "a pack's array offset 704 -> 700", code=PACKS + textwrap.dedent("""
        o = arrays['codes']['offset']; edit_header(f'"offset": {o}', f'"offset": {o - 4}'); repacked()""")),
    Case("disk caches", "a pack's int4 codes XORed", code=PACKS + textwrap.dedent("""
        c = arrays['codes']; a, b = c['offset'], c['offset'] + c['shape'][0]
        data[a:b] = bytes(x ^ 0x5A for x in data[a:b]); path.write_bytes(data); repacked()""")),
    Case("disk caches", "a pack's flipped bytes (a TiB shape)", code=PACKS + textwrap.dedent("""
        data[arrays['shape']['offset'] + 13] ^= 1; path.write_bytes(data); repacked()""")),
    Case("disk caches", "a pack's header shape [4] -> [3]", code=PACKS + textwrap.dedent("""
        edit_header('"shape": [4]', '"shape": [3]'); repacked()""")),
    Case("disk caches", "a pack's header dtype <i8 -> <i4", code=PACKS + textwrap.dedent("""
        edit_header('"dtype": "<i8"', '"dtype": "<i4"'); repacked()""")),
    Case("disk caches", "weight edited mid-file, mtime restored", code=PACKS + textwrap.dedent("""
        import os
        w = Path({model!r}).parent / 'llm.mnn.weight'
        shutil.copyfile(w.resolve(), 'weight'); os.replace('weight', w)
        answer()
        st = os.stat(w)
        with open(w, 'r+b') as f:
            f.seek(st.st_size // 2); b = f.read(1); f.seek(st.st_size // 2); f.write(bytes([b[0] ^ 0x10]))
        os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))
        _, cache = answer(); print('OK' if cache.hits == 0 else f'{cache.hits} stale packs mapped')""")),
    Case("disk caches", "a prefix cache relabelled as another prompt", code=KV + textwrap.dedent("""
        data = path.read_bytes(); n = struct.unpack_from('<I', data, 8)[0]
        head = json.loads(data[12:12 + n]); head['tokens'] = ids[1]; text = json.dumps(head).encode()
        path.write_bytes(data[:8] + struct.pack('<I', len(text)) + text + data[12 + n:])
        got = cached.generate(ids[1], 8)
        print('OK' if got == expected and not path.exists() else f'{got} for {expected}, kept: {path.exists()}')""")),
    Case("disk caches", "a second writer while a pack is mapped", code=PACKS + textwrap.dedent("""
        import subprocess, sys
        llm = mnnllm_core.create({model!r})
        llm.set_config({'sampler_type': 'greedy', 'use_mmap': True, 'tmp_path': 'packs'}); llm.load()
        other = ("import mnnllm_core\\nllm = mnnllm_core.create(%r)\\n" % {model!r} +
                 "llm.set_config({'use_mmap': True, 'tmp_path': 'packs'}); llm.load()\\n")
        with open(path, 'r+b') as f:  # in place, the size kept: refused by the other load, which writes it again
            f.seek(start); f.write(text.replace('"dtype": "<i8"', '"dtype": "<i4"', 1).encode())
        assert subprocess.run([sys.executable, '-c', other]).returncode == 0
        assert llm.generate(llm.tokenizer_encode('Hi'), 8) == first; print('OK')""")),
    # API argument types, and the server's answers to hostile requests
    *[Case("API argument types", call, code=LOAD + textwrap.dedent(f"""
        try: {call}; raise SystemExit('accepted')
        except mnnllm_core.errors.ArgumentError: print('OK')""")) for call in (
        "llm.generate(None)", "llm.response(None)", "llm.response(123)", "llm.response([{'role': 1, 'content': 'x'}])",
        "llm.response([{'content': 'x'}])", "llm.response([1, 2])", "llm.tokenizer_decode(None)",
        "llm.apply_chat_template(5)", "llm.forward(None)", "mnnllm_core.create(None)", "mnnllm_core.create(5)",
        "llm.generate({1: 2}, 2)")],
    Case("API argument types", "response before load()", code=textwrap.dedent("""
        import mnnllm_core
        try: mnnllm_core.create({model!r}).response('Hi'); raise SystemExit('accepted')
        except mnnllm_core.errors.NotLoadedError: print('OK')""")),
    Case("API argument types", "bad calls then a question", code=STATE + textwrap.dedent("""
        for bad in (lambda: llm.response([{'role': 'user', 'content': None}]), lambda: llm.forward([1], parents=5),
                    lambda: llm.response(Q, stream='yes'), lambda: llm.generate([1.5]), lambda: llm.set_config(5)):
            try: bad(); raise SystemExit('accepted')
            except mnnllm_core.MnnllmError: pass
        assert llm.response(Q) == A; print('OK')""")),
    *[Case("server", name, code=LOAD + textwrap.dedent(f"""
        import http.client, json, sys
        sys.path.insert(0, {TESTS!r})
        from serve_harness import LiveServer
        with LiveServer(llm) as server:
            host, port = server.url.rsplit('/', 1)[1].split(':')
            connection = http.client.HTTPConnection(host, int(port), timeout=60)
            connection.request('POST', '/v1/chat/completions', body={body})
            answer = connection.getresponse()
            payload = answer.read()
            assert answer.status == 400, (answer.status, payload[:200])
            assert set(json.loads(payload)['error']) == {{'message', 'type', 'param', 'code'}}
        print('OK')""")) for name, body in (  # each body is Python source, built in the case's process
        ("a body nested 100,000 deep", "b'{\"messages\": ' + b'[' * 100_000 + b']' * 100_000 + b'}'"),
        ("message content '\\ud800'", "b'{\"messages\": [{\"role\": \"user\", \"content\": \"\\\\ud800\"}]}'"),
        ("logit_bias key '\u00b2'", "json.dumps({'messages': [{'role': 'user', 'content': 'Hi'}], "
                                     "'logit_bias': {'\u00b2': 1}})"))],
    # issue 29 items 8-10: images sized before they are bounded, `~` unbounded, non-finite weights
    *[Case("model files, configs, graphs, vision inputs", name, code=textwrap.dedent(f"""
        import shutil, time, numpy as np
        from pathlib import Path
        import mnnllm_core
        from mnnllm_core.errors import ConfigError, ContextLengthError, FormatError
        from mnnllm_core.schema.reader import op_type_name, read_net_file
        VL = {str(SHARED / "models" / "vl")!r}
        def poke(folder, quant_type, at, raw):
            op = next(o for o in read_net_file(str(folder / 'llm.mnn')).oplists if op_type_name(o.type) == 'Convolution'
                      and o.main.quanParameter is not None and int(o.main.quanParameter.type) == quant_type)
            w = folder / 'llm.mnn.weight'; data = bytearray(w.read_bytes()); w.unlink()
            start = int(op.main.external[0]) + (int(op.main.external[1]) if quant_type == 1 else 0) + at
            data[start:start + len(raw)] = raw; w.write_bytes(bytes(data))
            return op.name
        def refused(error, call):
            start = time.perf_counter()
            try: call(); raise SystemExit('accepted')
            except error as err: assert time.perf_counter() - start < 5, time.perf_counter() - start; return err
        def vl():
            llm = mnnllm_core.create(VL + '/tiny-qwen2_vl-mnn-q4'); llm.set_config({{'sampler_type': 'greedy'}})
            return llm.load()
        image = VL + '/test_image.png'
        """) + body) for name, body in [
        ("a NaN quantization scale in llm.mnn.weight", textwrap.dedent("""
            folder = Path({model!r}).parent
            name = poke(folder, 1, 2, np.float16(np.nan).tobytes())
            err = refused(FormatError, lambda: mnnllm_core.create(str(folder)).load())
            assert repr(name) in str(err) and 'llm.mnn.weight' in str(err), err; print('OK')""")),
        ("an infinite fp16 weight (tiny Qwen2-VL)", textwrap.dedent("""
            folder = Path('fp16'); shutil.copytree(VL + '/tiny-qwen2_vl-mnn-fp16', folder)
            name = poke(folder, 3, 2000, np.float16(np.inf).tobytes())
            err = refused(FormatError, lambda: mnnllm_core.create(str(folder)).load())
            assert repr(name) in str(err) and 'llm.mnn.weight' in str(err), err; print('OK')""")),
        ("<hw>100000,100000</hw> image", textwrap.dedent("""
            llm = vl(); err = refused(ConfigError, lambda: llm.response(f'<img><hw>100000,100000</hw>{image}</img>Hi'))
            assert err.field == 'hw', err; print('OK')""")),
        ("<hw>2000,2000</hw> image", textwrap.dedent("""
            llm = vl(); err = refused(ContextLengthError, lambda: llm.response(f'<img><hw>2000,2000</hw>{image}</img>Hi'))
            assert err.field == 'hw', err; print('OK')""")),
        ("a (1, 10**6, 3) image array", textwrap.dedent("""
            import resource
            llm = vl(); start = time.perf_counter()
            llm.response([{'role': 'user', 'content': [{'type': 'image', 'image': np.ones((1, 10**6, 3), np.float32)},
                                                       {'type': 'text', 'text': 'Hi'}]}], max_new_tokens=2)
            assert time.perf_counter() - start < 10
            assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 2 << 20; print('OK')""")),
        ("an all-NaN image array", textwrap.dedent("""
            llm = vl(); nan = np.full((64, 64, 3), np.nan, np.float32)
            err = refused(FormatError, lambda: llm.response([{'role': 'user', 'content': [
                {'type': 'image', 'image': nan}, {'type': 'text', 'text': 'Hi'}]}]))
            assert err.field == 'image', err; print('OK')""")),
    ]],
    *[Case("templates", name, RUN + [QUESTION], llm_config(**{"jinja.chat_template": template})) for name, template in [
        ("29 doublings with ~", "{% set ns = namespace(s='a') %}{% for i in range(29) %}{% set ns.s = ns.s ~ ns.s %}"
                                "{% endfor %}{{ ns.s|length }}"),
        ("join of a list of references", "{% set s = 'a' * 1000000 %}{{ ([s] * 1000)|join|length }}"),
        ("indent of a million lines", "{{ ('x\\n' * 500000)|indent(1000)|length }}"),
        ("'{0}' * 1000 format of a long string", "{% set s = 'a' * 1000000 %}{{ ('{0}' * 1000).format(s)|length }}"),
        ("a captured block", "{% set s = 'a' * 1000000 %}{% set t %}{% for i in range(1000) %}{{ s }}{% endfor %}"
                             "{% endset %}{{ t|length }}"),
    ]],
]


def prepare(case: Case, work: Path) -> Path:
    folder = work / "model"
    folder.mkdir()
    for name in ("config.json", "llm_config.json", "tokenizer.mtok", "llm.mnn"):
        shutil.copy(MODEL / name, folder / name)
    os.symlink(MODEL / "llm.mnn.weight", folder / "llm.mnn.weight")
    if case.edit:
        case.edit(folder)
    return folder / "config.json"


def classify(case: Case, rc: int | None, out: str, err: str) -> str:
    if rc is None:
        return "hang"
    if rc < 0 or rc in (134, 137, 139):
        return "crash"
    if "Traceback" in err or "error: unexpected" in err:
        return "traceback"
    if case.code is not None:
        return "clean" if rc == 0 and out.strip().endswith("OK") else ("traceback" if rc else "silent")
    if case.expect == "error":
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        if rc == 2 and lines and all(len(line) <= 300 for line in lines):
            return "clean"
        return "silent" if rc == 0 else "traceback"
    return "clean" if rc == 0 and case.expect in out else "silent"


def run_case(case: Case, timeout: float) -> tuple[str, str]:
    with tempfile.TemporaryDirectory(prefix="mnnllm-probe-") as tmp:
        config_path = str(prepare(case, Path(tmp)))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if case.code is not None:
            argv = [sys.executable, "-c", case.code.replace("{model!r}", repr(config_path))]
        else:
            argv = [sys.executable, "-m", "mnnllm_core.cli"] + [a.replace("{model}", config_path) for a in case.argv]
        try:
            done = subprocess.run(argv, input=case.stdin, capture_output=True, timeout=timeout, env=env,
                                  text=True, errors="replace", cwd=tmp)
        except subprocess.TimeoutExpired:
            return "hang", f"> {timeout:.0f} s"
        result = classify(case, done.returncode, done.stdout, done.stderr)
        tail = (done.stderr.strip().splitlines() or [done.stdout.strip()[-120:]])[-1]
        return result, tail[:160]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the classes whose name contains this")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("-v", "--verbose", action="store_true", help="print each case's outcome")
    args = parser.parse_args()
    table: dict[str, dict[str, int]] = {}
    for case in CASES:
        if args.only and args.only not in case.kind:
            continue
        result, tail = run_case(case, args.timeout)
        table.setdefault(case.kind, dict.fromkeys(RESULTS, 0))[result] += 1
        if args.verbose or result != "clean":
            print(f"{case.kind:<15} {case.name:<38} {result:<9} {tail}", file=sys.stderr, flush=True)
    print("| class | cases | " + " | ".join(RESULTS) + " |")
    print("|---" * (len(RESULTS) + 2) + "|")
    for kind, counts in table.items():
        print(f"| {kind} | {sum(counts.values())} | " + " | ".join(str(counts[r]) for r in RESULTS) + " |")
    return 0 if all(counts["clean"] == sum(counts.values()) for counts in table.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
