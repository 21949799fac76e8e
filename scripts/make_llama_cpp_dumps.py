"""Real llama.cpp eval-callback dumps of the tiny llama (issue 29): tests/data/engines/*.real.ggml.txt.

Unlike the ``*.ggml.txt`` of scripts/make_engine_dumps.py (our text in llama.cpp's print format),
these are printed by llama.cpp itself: its ``convert_hf_to_gguf.py`` turns the committed tiny
llama (tests/data/archs/llama, rebuilt bit for bit) into an f32 GGUF, and its
``llama-eval-callback`` runs the prompt on the CPU and prints every graph node.

* ``llama_rope_theta.real.ggml.txt``: converted as the converter converts it.  It reads the config
  through transformers' ``AutoConfig(...).to_dict()``, and transformers 5 keeps rope theta only under
  ``rope_parameters``; the converter looks for ``hparams["rope_theta"]`` alone, writes no
  ``llama.rope.freq_base``, and llama.cpp falls back to 10000 where the checkpoint says 5000: a real
  converter bug (llama.cpp 4227c9b with transformers 5), not one we planted;
* ``llama_clean.real.ggml.txt``: the same with that fixed (``rope_theta`` copied to the top level of
  the converter's hparams), so the GGUF carries ``llama.rope.freq_base = 5000``;
* ``llama_rms_eps.real.ggml.txt``: that clean GGUF with ``llama.attention.layer_norm_rms_epsilon``
  rewritten from 1e-6 to 0.5 by gguf-py's ``gguf_set_metadata.py`` (a planted bug).

The tokenizer: the tiny llama has none that the converter takes, so ``set_vocab`` is replaced by a
SentencePiece-type ("llama") vocab of 256 pieces in which the prompt ``abcde`` tokenizes to
``IDS`` below (BOS, the space prefix, one piece per letter); the vocab does not touch the graph.
The ids are checked by the diff itself: inp_embd (GET_ROWS of the embedding) must match.

    LCPP=/tmp/lcpp/llama_cpp_python-0.3.16 PYTHONPATH=/tmp/torchlib \\
        .venv/bin/python scripts/make_llama_cpp_dumps.py

LCPP is llama-cpp-python 0.3.16's sdist, extracted, with llama-eval-callback built in LCPP/build:

    cmake -S vendor/llama.cpp -B build -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \\
        -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build build --target llama-eval-callback -j2
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "data"))
OUT = ROOT / "tests" / "data" / "engines"
PROMPT = "abcde"
#: BOS, "▁" (the space prefix), a, b, c, d, e
IDS = [1, 3, 17, 42, 7, 99, 250]
LETTERS = dict(zip("abcde", IDS[2:]))

CONVERT = r"""
import sys
sys.path.insert(0, sys.argv[1])
import convert_hf_to_gguf as c
import gguf

def set_vocab(self):
    n = self.hparams["vocab_size"]
    toks = [f"w{i}" for i in range(n)]
    types = [gguf.TokenType.NORMAL] * n
    toks[0], toks[1], toks[2], toks[3] = "<unk>", "<s>", "</s>", "\u2581"
    types[0], types[1], types[2] = gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL
    for ch, i in %(letters)r.items():
        toks[i] = ch
    w = self.gguf_writer
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * n)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

c.LlamaModel.set_vocab = set_vocab
if sys.argv[4] == "theta":  # the fix: transformers 5 keeps rope theta under rope_parameters only
    load = c.ModelBase.load_hparams

    def load_hparams(*a, **k):
        h = load(*a, **k)
        h.setdefault("rope_theta", (h.get("rope_parameters") or {}).get("rope_theta"))
        return h

    c.ModelBase.load_hparams = staticmethod(load_hparams)
sys.argv = ["convert_hf_to_gguf.py", sys.argv[2], "--outtype", "f32", "--outfile", sys.argv[3]]
c.main()
""" % {"letters": LETTERS}


def main() -> int:
    from make_arch_refs import HERE, write_checkpoint

    lcpp = Path(os.environ.get("LCPP", "/tmp/lcpp/llama_cpp_python-0.3.16"))
    llama = lcpp / "vendor" / "llama.cpp"
    tool = lcpp / "build" / "bin" / "llama-eval-callback"
    if not tool.is_file():
        print(f"error: {tool} not built (see this script's docstring)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(llama / "gguf-py"), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "convert.py").write_text(CONVERT)
        ck = write_checkpoint(tmp / "llama", HERE / "llama")
        for name, fix in (("llama_clean", "theta"), ("llama_rope_theta", "none")):
            gguf_path = tmp / f"{name}.gguf"
            subprocess.run([sys.executable, str(tmp / "convert.py"), str(llama), str(ck), str(gguf_path), fix],
                           env=env, check=True)
            dumps = [(name, gguf_path)]
            if name == "llama_clean":  # a planted bug: the clean GGUF's RMS norm epsilon 1e-6 -> 0.5
                eps = tmp / "llama_rms_eps.gguf"
                shutil.copyfile(gguf_path, eps)
                subprocess.run([sys.executable, str(llama / "gguf-py" / "gguf" / "scripts" / "gguf_set_metadata.py"),
                                str(eps), "llama.attention.layer_norm_rms_epsilon", "0.5", "--force"],
                               env=env, check=True)
                dumps.append(("llama_rms_eps", eps))
            for name, gguf_path in dumps:
                run = subprocess.run([str(tool), "-m", str(gguf_path), "-p", PROMPT, "-n", "1",
                                      "-t", "2", "-c", "512", "--seed", "0"],
                                     capture_output=True, text=True, check=True)
                text = run.stderr + run.stdout  # the log (build, GGUF keys), then the tensors
                (OUT / f"{name}.real.ggml.txt").write_text(text)
                print(f"{name}: {len(text)} chars")
    return 0


if __name__ == "__main__":
    sys.exit(main())
