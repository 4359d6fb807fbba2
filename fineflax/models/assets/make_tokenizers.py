"""Regenerates the bundled tokenizer of the "smollm2-135m-instruct" alias from its GGUF file.

  python fineflax/models/assets/make_tokenizers.py

transformers converts GGUF tokenizers only when torch is installed; the converted files are shipped (the
JSON gzipped) so that the quickstart needs no torch. tests/test_models_tokenizer.py checks that they
still equal transformers' own conversion.
"""
import gzip
import pathlib
import shutil
import tempfile

from transformers import AutoTokenizer

from fineflax.models.load import resolve_source

OUT = pathlib.Path(__file__).parent / "smollm2-135m-instruct"


def main():
  gguf = resolve_source("smollm2-135m-instruct")
  tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
  with tempfile.TemporaryDirectory() as tmp:
    tok.save_pretrained(tmp)
    OUT.mkdir(exist_ok=True)
    for f in pathlib.Path(tmp).iterdir():
      if f.name == "tokenizer.json":
        with open(f, "rb") as src, gzip.GzipFile(OUT / "tokenizer.json.gz", "wb", mtime=0) as dst:
          shutil.copyfileobj(src, dst)
      else:
        shutil.copy(f, OUT / f.name)
  print(sorted(p.name for p in OUT.iterdir()))


if __name__ == "__main__":
  main()
