"""Find the one JSON object an LLM meant in its reply, repairing the faults real models make, never a fragment.

Replies are data: they are only parsed, never evaluated. The objects considered are the reply's *top-level*
brace spans (and the bodies of its code fences); an object nested inside a span that failed to parse is never
promoted to "the answer", because that is how a quantization entry once passed for a whole plan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

MAX_TEXT = 200_000  # characters of LLM text scanned
MAX_SPANS = 50  # top-level brace spans tried
_VALID_ESCAPES = set('"\\/bfnrtu')
CLOSED = "closed what was left open before an enclosing bracket closed"


class ReplyError(ValueError):
    """The reply holds no usable object; the message says why, for the LLM's retry prompt."""


@dataclass(frozen=True)
class Found:
    """The object found and how: `repairs` names each fix applied (empty when the JSON was valid as written)."""

    value: dict[str, Any]
    repairs: tuple[str, ...]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant)


def fenced_blocks(text: str) -> list[str]:
    """Return the bodies of the reply's ``` code fences, in order."""
    return [m.group(1) for m in re.finditer(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", text, flags=re.DOTALL)]


def scan(text: str, start: int = 0) -> Iterator[tuple[int, str, bool]]:
    """Yield (index, character, inside a double-quoted string) of `text` from `start`, escapes understood."""
    in_string, escaped = False, False
    for i in range(start, len(text)):
        ch = text[i]
        if not in_string:
            in_string = ch == '"'
            yield i, ch, False
            continue
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            in_string = False
        yield i, ch, True


def brace_spans(text: str) -> list[tuple[str, bool]]:
    """Split `text` into its top-level `{...}` spans, string-aware, each with "inside an object cut off".

    A `{` whose span never closes (a truncated reply, or a stray brace in prose) runs to the end of the text;
    scanning resumes after it, and every span found from there on is flagged: it may be a fragment of the
    object that was cut off, so it can explain an error but is never taken as the answer.
    """
    spans: list[tuple[str, bool]] = []
    inside_cut = False
    start = text.find("{")
    while start != -1 and len(spans) < MAX_SPANS:
        depth, end = 0, -1
        for i, ch, quoted in scan(text, start):
            if quoted:
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    end = i
                    break
        if end == -1:
            inside_cut = True
            start = text.find("{", start + 1)
            continue
        spans.append((text[start : end + 1], inside_cut))
        start = text.find("{", end + 1)
    if inside_cut and not any(flag for _, flag in spans):
        spans.append(("", True))  # the cut-off object held no complete inner object: still say it was cut off
    return spans


def escape_stray_backslashes(text: str) -> str:
    r"""Double every backslash inside a JSON string that does not start a valid JSON escape.

    Models write regexes such as "^vit\.layers" with one backslash (`\.` is no JSON escape); doubling it
    keeps the regex the model meant.
    """
    out: list[str] = []
    in_string, i = False, 0
    while i < len(text):
        ch = text[i]
        if in_string and ch == "\\":
            nxt = text[i + 1] if i + 1 < len(text) else ""
            if nxt in _VALID_ESCAPES and nxt:
                out.append(ch + nxt)
                i += 2
                continue
            out.append("\\\\")
            i += 1
            continue
        if ch == '"':
            in_string = not in_string
        out.append(ch)
        i += 1
    return "".join(out)


def without_trailing_commas(text: str) -> str:
    """Drop commas that directly precede a closing bracket or brace."""
    return re.sub(r",(\s*[}\]])", r"\1", text)


def close_left_open(text: str) -> str:
    """Close the objects a reply left open inside a list when the list closes: `[{"a": 1 ]` reads `[{"a": 1}]`.

    A `]` whose `[` is open further down the (string-aware) stack closes the objects opened after that `[` first.
    Nothing is dropped: a truncated reply stays truncated, and `[}` is not read as an empty list.
    """
    out: list[str] = []
    stack: list[str] = []
    for _, ch, quoted in scan(text):
        if quoted:
            out.append(ch)
            continue
        if ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch == "]" and "]" in stack:
            while stack[-1] != "]":  # objects opened inside this list and never closed: closed now
                out.append(stack.pop())
            stack.pop()
        elif ch == "}" and stack and stack[-1] == "}":
            stack.pop()
        out.append(ch)
    return "".join(out)


def brackets_balanced(text: str) -> bool:
    """Return True when every `{`/`[` outside quoted strings (single or double quotes) closes in order."""
    stack: list[str] = []
    quote, escaped = "", False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return False
    return not stack and not quote


def _library_repair(text: str) -> Any:
    """Repair with json-repair, but only text whose brackets balance.

    json-repair would also "complete" a broken or truncated object by dropping what it cannot read, and a
    fragment must never pass for the whole.
    """
    if not brackets_balanced(text):
        return None
    try:
        import json_repair  # lazy: probe; a missing json_repair only loses this last repair
    except ImportError:  # the library is a dependency, but a missing one only loses this last repair
        return None
    try:
        return json_repair.loads(text)
    except Exception:  # noqa: BLE001 - a repair that fails is no repair
        return None


def parse_object(text: str) -> tuple[dict[str, Any] | None, tuple[str, ...], str]:
    """Parse one complete `{...}` span: as written, then with known repairs; return (object, repairs, error)."""
    error = ""
    attempts: list[tuple[str, tuple[str, ...]]] = [(text, ())]
    escaped = escape_stray_backslashes(text)
    if escaped != text:
        attempts.append((escaped, ("escaped stray backslashes",)))
    trimmed = without_trailing_commas(escaped)
    if trimmed != escaped:
        attempts.append((trimmed, (*attempts[-1][1], "dropped trailing commas")))
    for variant, repairs in attempts:
        try:
            value = _loads(variant.strip())
        except RecursionError:
            return None, (), "the JSON is nested too deeply"
        except ValueError as exc:
            if "is not allowed" in str(exc):  # NaN/Infinity: refused, not repaired into something else
                return None, (), str(exc)
            error = error or str(exc)
            continue
        return (value, repairs, "") if isinstance(value, dict) else (None, (), "not an object")
    value = _library_repair(text)  # single quotes, Python literals, unquoted keys, comments...
    if isinstance(value, dict) and value:
        return value, ("repaired with json-repair",), ""
    return None, (), error


def find_object(
    text: str, shaped: Callable[[dict[str, Any]], dict[str, Any] | None], what: str, form: str = ""
) -> Found:
    """Return the one object of `text` with the shape `shaped` accepts (it may unwrap it); else raise ReplyError.

    Args:
        text: The LLM's reply.
        shaped: Returns the wanted object (the argument or an object it wraps) or None when the shape is wrong.
        what: What is wanted, for error messages ("plan", "input shape").
        form: The wanted object's outline, quoted when an object of the wrong shape is all the reply holds.

    Raises:
        ReplyError: When no top-level object has the shape; the message says what was wrong with the reply.
    """
    if not isinstance(text, str) or not text.strip():
        raise ReplyError(f"the reply is empty: answer with the JSON {what}")
    text = text[:MAX_TEXT]
    errors: list[str] = []
    wrong_shape = fragments = 0
    seen: set[str] = set()
    chunks: list[tuple[str, tuple[str, ...]]] = [(c, ()) for c in (*fenced_blocks(text), text)]
    chunks += [(closed, (CLOSED,)) for c, _ in list(chunks) if (closed := close_left_open(c)) != c]
    for chunk, mended in chunks:
        for span, inside_cut in brace_spans(chunk):
            if inside_cut:
                fragments += 1
                continue
            if span in seen:
                continue
            seen.add(span)
            value, repairs, error = parse_object(span)
            if value is None:
                errors.append(error)
                continue
            wanted = shaped(value)
            if wanted is not None:
                return Found(wanted, (*mended, *repairs))
            wrong_shape += 1
    if fragments:
        raise ReplyError(f"the reply's JSON is cut off before its closing brace: answer with the complete {what}")
    if errors and errors[0] == "the JSON is nested too deeply":
        raise ReplyError(errors[0])
    if errors:
        raise ReplyError(f"the reply's JSON could not be parsed ({errors[0][:160]}): answer with one valid JSON {what}")
    if wrong_shape:
        raise ReplyError(f"the reply's JSON object is not a {what}" + (f"; a {what} looks like {form}" if form else ""))
    raise ReplyError(f"no JSON object found in the reply: answer with the {what} as one JSON object, no code")
