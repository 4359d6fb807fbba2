"""Chroma-style `where` / `where_document` filters compiled to SQL over the store's tables.

where: {"key": value} (same as $eq), {"key": {op: value}} with op in $eq $ne $gt $gte $lt $lte $in $nin
$contains $not_contains, {"$and": [where, ...]}, {"$or": [where, ...]}; several keys in one dict are AND-ed.
$ne / $nin / $not_contains also match records that lack the key (they are NOT($eq) / NOT($in) /
NOT($contains)). $gt..$lte need numbers. As in Chroma 1.5: a metadata value may be a non-empty list of one
scalar type; $contains / $not_contains test membership in such a list (a scalar value never "contains");
$eq / $in / $gt.. never match a list value.
where_document: {"$contains": s}, {"$not_contains": s} (case-sensitive substring), {"$regex": p},
{"$not_regex": p} (Python `re.search`), $and / $or of those. A record without a document matches only the
$not_ forms.
Metadata values are stored typed in table `meta(rid, key, t, s, n)`: t = "s" (str), "n" (int/float),
"b" (bool, n = 0/1), so 1 never equals True or "1"; list elements get t = "ls" / "ln" / "lb".
"""
from __future__ import annotations

import re
from typing import Any

_CMP = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
_OPS = ("$eq", "$ne", "$in", "$nin", "$contains", "$not_contains") + tuple(_CMP)
_DOC_OPS = ("$contains", "$not_contains", "$regex", "$not_regex")


def typed(value: Any, where: str) -> tuple[str, str | None, float | None]:
  """(t, s, n) storage of a scalar metadata value; ValueError naming `where` otherwise."""
  if isinstance(value, bool):
    return "b", None, float(value)
  if isinstance(value, (int, float)):
    if value != value:
      raise ValueError(f"{where}: NaN is not a valid metadata value")
    return "n", None, float(value)
  if isinstance(value, str):
    return "s", value, None
  raise ValueError(f"{where}: value {value!r} is {type(value).__name__}; expected str, int, float or bool")


def meta_rows(meta: dict, where: str) -> list[tuple[str, str, str | None, float | None]]:
  """(key, t, s, n) rows of table `meta` for one record's metadata (a list gives one row per element)."""
  rows = []
  for key, value in meta.items():
    if isinstance(value, (list, tuple)):
      if not value:
        raise ValueError(f"{where}[{key!r}]: a list value must be non-empty")
      cells = [typed(v, f"{where}[{key!r}][{i}]") for i, v in enumerate(value)]
      if len({c[0] for c in cells}) > 1:
        raise ValueError(f"{where}[{key!r}]: list {value!r} mixes types; use one of str, int/float, bool")
      rows += [(key, "l" + t, s, n) for t, s, n in cells]
    elif value is not None:
      rows.append((key, *typed(value, f"{where}[{key!r}]")))
  return rows


def _contains_sql(key: str, value: Any, where: str) -> tuple[str, list]:
  t, s, n = typed(value, where)
  if t == "s":
    return "r.rid IN (SELECT rid FROM meta WHERE key = ? AND t = 'ls' AND s = ?)", [key, s]
  return "r.rid IN (SELECT rid FROM meta WHERE key = ? AND t = ? AND n = ?)", [key, "l" + t, n]


def _eq_sql(key: str, value: Any, where: str) -> tuple[str, list]:
  t, s, n = typed(value, where)
  if t == "s":
    return "r.rid IN (SELECT rid FROM meta WHERE key = ? AND t = 's' AND s = ?)", [key, s]
  return "r.rid IN (SELECT rid FROM meta WHERE key = ? AND t = ? AND n = ?)", [key, t, n]


def _in_sql(key: str, values: Any, where: str) -> tuple[str, list]:
  """One index lookup: key = ? AND (t = 's' AND s IN (...) OR t = 'n' AND n IN (...) OR t = 'b' AND ...)."""
  if not isinstance(values, (list, tuple)) or not values:
    raise ValueError(f"{where}: expected a non-empty list, got {values!r}")
  by_type: dict[str, list] = {}
  for i, v in enumerate(values):
    t, s, n = typed(v, f"{where}[{i}]")
    by_type.setdefault(t, []).append(s if t == "s" else n)
  parts, params = [], [key]
  for t, vals in by_type.items():
    parts.append(f"(t = '{t}' AND {'s' if t == 's' else 'n'} IN ({','.join('?' * len(vals))}))")
    params += vals
  return f"r.rid IN (SELECT rid FROM meta WHERE key = ? AND ({' OR '.join(parts)}))", params


def _field_sql(key: str, cond: Any, where: str) -> tuple[str, list]:
  if not isinstance(cond, dict):
    return _eq_sql(key, cond, where)
  if len(cond) != 1:
    raise ValueError(f"{where}: an operator dict needs exactly one operator, got {sorted(cond)}")
  (op, value), = cond.items()
  at = f"{where}[{op!r}]"
  if op == "$eq":
    return _eq_sql(key, value, at)
  if op == "$ne":
    sql, p = _eq_sql(key, value, at)
    return f"NOT ({sql})", p
  if op == "$in":
    return _in_sql(key, value, at)
  if op == "$nin":
    sql, p = _in_sql(key, value, at)
    return f"NOT {sql}", p
  if op == "$contains":
    return _contains_sql(key, value, at)
  if op == "$not_contains":
    sql, p = _contains_sql(key, value, at)
    return f"NOT ({sql})", p
  if op in _CMP:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ValueError(f"{at}: expected a number, got {value!r}")
    return f"r.rid IN (SELECT rid FROM meta WHERE key = ? AND t = 'n' AND n {_CMP[op]} ?)", [key, float(value)]
  raise ValueError(f"{where}: unknown operator {op!r}; expected one of {_OPS}")


def _logical(op: str, items: Any, where: str, compile_one) -> tuple[str, list]:
  if not isinstance(items, list) or not items:
    raise ValueError(f"{where}[{op!r}]: expected a non-empty list of filters, got {items!r}")
  parts, params = [], []
  for i, item in enumerate(items):
    sql, p = compile_one(item, f"{where}[{op!r}][{i}]")
    parts.append(f"({sql})")
    params += p
  return (" AND " if op == "$and" else " OR ").join(parts), params


def where_sql(where: dict | None, at: str = "where") -> tuple[str, list]:
  """SQL boolean expression over `records r` and its parameters; "1" for no filter."""
  if not where:
    return "1", []
  if not isinstance(where, dict):
    raise ValueError(f"{at}: expected a dict, got {type(where).__name__}")
  parts, params = [], []
  for key, cond in where.items():
    if key in ("$and", "$or"):
      sql, p = _logical(key, cond, at, where_sql)
    elif key.startswith("$"):
      raise ValueError(f"{at}: unknown operator {key!r}; expected $and, $or or a metadata key")
    else:
      sql, p = _field_sql(key, cond, f"{at}[{key!r}]")
    parts.append(f"({sql})")
    params += p
  return " AND ".join(parts), params


def where_document_sql(where: dict | None, at: str = "where_document") -> tuple[str, list]:
  """SQL boolean expression over `r.document` for $contains / $not_contains / $regex / $not_regex / $and /
  $or. The regex forms need the connection's REGEXP function (memory.store registers it)."""
  if not where:
    return "1", []
  if not isinstance(where, dict) or len(where) != 1:
    raise ValueError(f"{at}: expected a dict with one operator, got {where!r}")
  (op, value), = where.items()
  if op in ("$and", "$or"):
    return _logical(op, value, at, where_document_sql)
  if op not in _DOC_OPS:
    raise ValueError(f"{at}: unknown operator {op!r}; expected one of {_DOC_OPS + ('$and', '$or')}")
  if not isinstance(value, str) or not value:
    raise ValueError(f"{at}[{op!r}]: expected a non-empty string, got {value!r}")
  if op in ("$regex", "$not_regex"):
    try:
      re.compile(value)
    except re.error as e:
      raise ValueError(f"{at}[{op!r}]: invalid regular expression {value!r} ({e})") from None
    return ("coalesce(regexp(?, r.document), 0) = " + ("1" if op == "$regex" else "0")), [value]
  return f"instr(coalesce(r.document, ''), ?) {'>' if op == '$contains' else '='} 0", [value]


def correlated(sql: str) -> str:
  """The same filter as per-row EXISTS lookups (fast when few rows are tested, e.g. id IN (...))."""
  return sql.replace("r.rid IN (SELECT rid FROM meta WHERE ", "EXISTS (SELECT 1 FROM meta WHERE meta.rid = r.rid AND ")
