"""The `code` reward's test harness: run as main.py inside the sandbox (standard library only).

Two processes, so that results are compared outside the solution's process:
- the harness (this process) forks the solution process first, then reads the nonce line and the test
  spec (JSON: {"setup": [...], "tests": [...]}) from stdin, so neither is ever in the solution's memory,
  files, argv or environment; it marks itself non-dumpable (PR_SET_DUMPABLE 0), so the solution process
  (same uid, no capabilities) cannot ptrace it or read its memory or file descriptors through /proc;
- the solution process points its stdin at /dev/null and its stdout at stderr, runs solution.py as module
  `solution`, then answers requests over a pipe: call a function, get an attribute, index, iterate.
  Only plain values cross: None, bool, int, float, complex, str, bytes, and lists, tuples, sets,
  frozensets and dicts of them (a NumPy result as its `tolist()`), as tagged JSON (`encode` / `decode`);
  anything else stays in the solution's process and is seen by the harness as a `Remote`, which can be
  called or inspected but never compared, hashed or tested for truth (TypeError).
The harness runs the setup and the tests (assert statements, a HumanEval `check(candidate)`) itself on
those plain values and prints `<nonce> <i> <0|1>` per test to its stdout, which the solution process
cannot write (its fd 1 is stderr; the stdout file is outside the sandbox's root). So an object whose
`__eq__` always returns True scores 0, and so does printing or forging result lines.
Limits: a test may not pass a function of its own into the solution (TypeError); the solution's values
are still computed by the solution (a wrong value is a wrong answer, but it can be any plain value). The
guarantees about the nonce need a namespace mode of the sandbox: in the weak 'rlimits' mode as root the
solution process keeps CAP_SYS_PTRACE and can reach the stdout file.
"""
import builtins
import ctypes
import json
import os
import sys
import traceback

_PR_SET_DUMPABLE = 4
_TAGS = {"l": list, "t": tuple, "s": set, "f": frozenset}
_NOT_RAISED = (SystemExit, KeyboardInterrupt, GeneratorExit)


class Remote:
  """A value that stayed in the solution's process: call it, get attributes, index or iterate it."""
  __slots__ = ("_link", "_id", "_type")

  def __init__(self, link, id_, type_name):
    self._link, self._id, self._type = link, id_, type_name

  def __call__(self, *args, **kwargs):
    return self._link.ask("call", self._id, args=[encode(a) for a in args],
                          kw=[[k, encode(v)] for k, v in kwargs.items()])

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    return self._link.ask("getattr", self._id, name=name)

  def __getitem__(self, key):
    return self._link.ask("getitem", self._id, key=encode(key))

  def __iter__(self):
    return iter(self._link.ask("list", self._id))

  def __next__(self):
    return self._link.ask("next", self._id)

  def __len__(self):
    return self._link.ask("len", self._id)

  def _refuse(self, *_):
    raise TypeError(f"a {self._type} object from the solution is not a plain value: it cannot be compared")

  __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = _refuse

  def __repr__(self):
    return f"<{self._type} object of the solution>"


def encode(v, keep=None):
  """A plain value as tagged JSON; a non-plain one is kept in `keep` and sent as a handle (solution side)
  or refused (harness side: keep is None)."""
  if isinstance(v, Remote):
    return {"h": v._id}
  if v is None or isinstance(v, (bool, int, float, str)):
    return v
  if isinstance(v, (bytes, bytearray)):
    return {"b": bytes(v).hex()}
  if isinstance(v, complex):
    return {"c": [v.real, v.imag]}
  for tag, kind in _TAGS.items():
    if isinstance(v, kind):
      return {tag: [encode(x, keep) for x in v]}
  if isinstance(v, dict):
    return {"d": [[encode(k, keep), encode(x, keep)] for k, x in v.items()]}
  if keep is None:
    raise TypeError(f"cannot pass a {type(v).__name__} into the solution's process (plain values only)")
  if type(v).__module__ == "numpy" and hasattr(v, "tolist"):  # a NumPy scalar or array result
    return encode(v.tolist(), keep)
  keep.append(v)
  return {"h": len(keep) - 1, "r": type(v).__name__}


def decode(x, handle):
  """The value of tagged JSON `x`, built from builtins only; `handle(id, type name)` makes handles."""
  if x is None or type(x) in (bool, int, float, str):
    return x
  if type(x) is not dict or len(x) not in (1, 2):
    raise ValueError(f"malformed value {str(x)[:80]}")
  (tag, body), = list(x.items())[:1]
  if tag in _TAGS:
    return _TAGS[tag](decode(e, handle) for e in body)
  if tag == "d":
    return {decode(k, handle): decode(e, handle) for k, e in body}
  if tag == "b":
    return bytes.fromhex(body)
  if tag == "c":
    return complex(float(body[0]), float(body[1]))
  if tag == "h":
    return handle(int(body), str(x.get("r", "")))
  raise ValueError(f"unknown tag {tag!r}")


class _Link:
  """The harness's end of the pipes to the solution process."""

  def __init__(self, requests, replies):
    self.requests, self.replies, self.gone = requests, replies, None

  def receive(self):
    line = self.replies.readline()
    if not line:
      self.gone = "the solution's process exited"
      raise RuntimeError(self.gone)
    return json.loads(line)

  def ask(self, op, id_, **fields):
    if self.gone:
      raise RuntimeError(self.gone)
    self.requests.write(json.dumps({"op": op, "h": id_, **fields}).encode() + b"\n")
    self.requests.flush()
    reply = self.receive()
    if "err" in reply:
      name, message = str(reply["err"][0]), str(reply["err"][1])
      kind = getattr(builtins, name, None)
      if isinstance(kind, type) and issubclass(kind, BaseException) and not issubclass(kind, _NOT_RAISED):
        raise kind(message)
      raise RuntimeError(f"{name}: {message}")
    return decode(reply["ok"], lambda i, t: Remote(self, i, t))


def _encode_or_keep(v, keep):
  """`encode(v, keep)`, or a handle where that fails (e.g. a cyclic list)."""
  try:
    return encode(v, keep)
  except (RecursionError, ValueError, TypeError):
    keep.append(v)
    return {"h": len(keep) - 1, "r": type(v).__name__}


def _serve(requests, replies) -> None:
  """The solution process: run solution.py, send its names, answer requests until the pipe closes."""
  keep = []
  send = lambda msg: (replies.write(json.dumps(msg).encode() + b"\n"), replies.flush())  # noqa: E731
  ns = {"__name__": "solution"}
  try:
    exec(compile(open("solution.py", encoding="utf-8").read(), "solution.py", "exec"), ns)
    names = [[k, _encode_or_keep(v, keep)] for k, v in list(ns.items()) if not k.startswith("__")]
  except BaseException:  # noqa: BLE001 - the solution failed at import: every test fails
    traceback.print_exc(limit=5)
    send({"error": "the solution failed at import"})
    return
  send({"names": names})
  for line in requests:
    try:
      req = json.loads(line)
      obj = keep[req["h"]]
      arg = lambda x: decode(x, lambda i, _: keep[i])  # noqa: E731
      op = req["op"]
      if op == "call":
        value = obj(*[arg(a) for a in req["args"]], **{k: arg(v) for k, v in req["kw"]})
      elif op == "getattr":
        value = getattr(obj, req["name"])
      elif op == "getitem":
        value = obj[arg(req["key"])]
      elif op == "list":
        value = list(obj)
      elif op == "next":
        value = next(obj)
      elif op == "len":
        value = len(obj)
      else:
        raise ValueError(f"unknown request {op!r}")
      reply = {"ok": encode(value, keep)}
    except BaseException as e:  # noqa: BLE001 - reported to the harness, which fails that test
      reply = {"err": [type(e).__name__, str(e)[:2000]]}
    send(reply)


def main() -> None:
  if ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
    sys.exit("harness: prctl(PR_SET_DUMPABLE, 0) failed; not running the solution next to the nonce")
  request_r, request_w = os.pipe()
  reply_r, reply_w = os.pipe()
  pid = os.fork()
  if pid == 0:  # the solution process: nothing of the harness's secrets exists yet
    os.close(request_w)
    os.close(reply_r)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    try:
      _serve(os.fdopen(request_r, "rb"), os.fdopen(reply_w, "wb"))
    finally:
      os._exit(0)
  os.close(request_r)
  os.close(reply_w)
  nonce = sys.stdin.readline().strip()
  spec = json.loads(sys.stdin.read())
  result_fd = os.dup(1)
  sys.stdout = sys.stderr  # what tests print goes to stderr; results only through result_fd
  link = _Link(os.fdopen(request_w, "wb"), os.fdopen(reply_r, "rb"))
  ns = {"__name__": "__harness__"}
  try:
    _run_tests(link, spec, ns, nonce, result_fd)
  finally:
    os.kill(pid, 9)
    os.waitpid(pid, 0)


def _run_tests(link, spec, ns, nonce, result_fd) -> None:
  """Setup, then each test, in this process on the solution's plain values; one result line per test."""
  try:
    ready = link.receive()
    if "names" not in ready:
      raise RuntimeError(ready.get("error", "no names from the solution"))
    ns.update({k: decode(v, lambda i, t: Remote(link, i, t)) for k, v in ready["names"]})
    for i, src in enumerate(spec["setup"]):
      exec(compile(src, f"setup_{i}", "exec"), ns)
  except BaseException:  # noqa: BLE001 - no test can pass
    traceback.print_exc(limit=5)
    spec["tests"] = []
  for i, src in enumerate(spec["tests"]):
    try:
      exec(compile(src, f"test_{i}", "exec"), ns)
      ok = 1
    except BaseException:  # noqa: BLE001 - a failed test
      traceback.print_exc(limit=3)
      ok = 0
    os.write(result_fd, f"{nonce} {i} {ok}\n".encode())


if __name__ == "__main__":
  main()
