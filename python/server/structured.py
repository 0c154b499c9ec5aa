"""Structured outputs: `response_format` (json_object, json_schema) and a forced `tool_choice`
("required", or one named function) become an llguidance grammar over the checkpoint's tokenizer.
Each choice of such a request gets its own matcher (a `Constraint`); the runtime's loop thread
advances it by every sampled token and hands the engine the next token's mask.

llguidance rather than xgrammar: it is the peer's library, its Python wheel needs neither torch nor
transformers (xgrammar's requires both), it builds a 150k-token vocabulary's tables in milliseconds,
and its Lark dialect takes special tokens and inline JSON schemas, which GLM's tool-call format needs.

Reasoning comes first: when the prompt opens a <think> block, a choice is free until `</think>` and
the grammar starts after it (the engine then samples the reasoning as any other row, on the GPU when
it can); when `</think>` is not one token of the vocabulary, the grammar itself takes the reasoning."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
from llguidance import LLMatcher, LLTokenizer

from .errors import ApiError
from .glm_output import CALL_TAGS, THINK_CLOSE

# JSON whitespace between tokens, bounded: a free `[ \t\n\r]*` lets a weak model fill max_tokens
# with blanks while every token is "valid".
WHITESPACE = r"[\x20\x0A\x0D\x09]{0,16}"


@dataclasses.dataclass
class Grammar:
    lark: str
    # Generation starts inside reasoning and the grammar waits for this token (see the header).
    gate_token: int | None


class Grammars:
    """The llguidance view of one checkpoint's tokenizer, built once per server."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: list[int], token_id):
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.tokenizer = LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids) or None)
        self._token_id = token_id

    def for_request(self, body, tools: list[dict] | None, starts_in_reasoning: bool) -> Grammar | None:
        """The grammar a chat request asks for, or None when it asks for none. Raises ApiError 400
        for a schema or tool choice that cannot be enforced."""
        forced = forced_tools(body.tool_choice, tools)
        if forced:
            body_rule, param = self._tool_calls(forced, body.parallel_tool_calls is not False), "tools"
        elif body.response_format is not None and body.response_format.type != "text":
            body_rule, param = self._json(body.response_format), "response_format"
        else:
            return None
        gate = self._single_token(THINK_CLOSE) if starts_in_reasoning else None
        rules = [body_rule]
        opening = ""
        if starts_in_reasoning and gate is None:
            opening = self._text("reasoning", lark_string(THINK_CLOSE), rules) + " "
        lark = "\n".join([f"start: {opening}NL? body", 'NL: "\\n"', *rules]) + "\n"
        problem = LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(lark), self.tokenizer)
        if problem:
            raise ApiError(400, f"cannot enforce this {param}: {problem.splitlines()[0]}", param=param, code="invalid_value")
        return Grammar(lark, gate)

    def constraint(self, grammar: Grammar) -> "Constraint":
        matcher = LLMatcher(self.tokenizer, LLMatcher.grammar_from_lark(grammar.lark), log_level=0)
        return Constraint(matcher, grammar.gate_token, self.words)

    # ---- grammar pieces ----

    def _json(self, response_format) -> str:
        if response_format.type == "json_object":
            return f"body: {inline_json({'type': 'object'})}\n"
        spec = response_format.json_schema
        schema = dict(spec.schema_ or {})
        if spec.strict:
            schema = closed_objects(schema)
        return f"body: {inline_json(schema)}\n"

    def _tool_calls(self, tools: list[dict], parallel: bool) -> str:
        """GLM's call format (GLM.md §5.3): `<tool_call>NAME<arg_key>K</arg_key><arg_value>V
        </arg_value>...</tool_call>`, with the newlines GLM-4.5/4.6 put between parts allowed; one
        or more calls. Arguments follow the function's properties in their declared order, the
        required ones always; strings are written raw, other types as JSON of their schema. One
        call when parallel_tool_calls is false, else one or more."""
        open_call, close_call, open_key, close_key, open_value, close_value = (self._tag(t) for t in CALL_TAGS)
        rules = [f"body: call{'+' if parallel else ''}\ncall: {open_call} (" + " | ".join(f"tool_{i}" for i in range(len(tools))) + f") NL? {close_call} NL?"]
        for i, tool in enumerate(tools):
            function = tool["function"]
            parameters = function.get("parameters") or {}
            properties = parameters.get("properties") or {}
            required = set(parameters.get("required") or [])
            parts = []
            for j, (key, schema) in enumerate(properties.items()):
                rule = f"arg_{i}_{j}"
                parts.append(rule if key in required else f"{rule}?")
                rules.append(f"{rule}: NL? {open_key} {lark_string(key)} {close_key} NL? {open_value} "
                             f"{self._value(f'{rule}_value', schema, close_value, rules)}")
            if not properties and parameters.get("additionalProperties", True) is not False:
                parts.append(f"free_arg_{i}*")
                rules.append(f"free_arg_{i}: NL? {open_key} {self._text(f'free_key_{i}', close_key, rules)} NL? {open_value} "
                             f"{self._text(f'free_value_{i}', close_value, rules)}")
            rules.append(f"tool_{i}: {lark_string(function['name'])} " + " ".join(parts))
        return "\n".join(rules) + "\n"

    def _value(self, name: str, schema, close: str, rules: list[str]) -> str:
        """An argument's value: a string parameter's text as written (GLM writes strings raw),
        within its enum, pattern or length; anything else as JSON of its schema."""
        if not isinstance(schema, dict) or schema.get("type") != "string":
            return f"{inline_json(schema if isinstance(schema, dict) else {})} {close}"
        if "enum" in schema or "const" in schema:
            choices = schema["enum"] if "enum" in schema else [schema["const"]]
            return "(" + " | ".join(lark_string(str(c)) for c in choices) + f") {close}"
        if "pattern" in schema:
            return self._text(name, close, rules, schema["pattern"].removeprefix("^").removesuffix("$"))
        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        return self._text(name, close, rules, f"(.|\\n){{{low},{'' if high is None else int(high)}}}")

    def _text(self, name: str, close: str, rules: list[str], pattern: str = "(.|\\n)*") -> str:
        """A text matching `pattern`, ended by `close`: a special token ends it by being sampled,
        a text tag by a lazy match of its characters."""
        pattern = pattern.replace("/", "\\/")  # Lark's regex delimiter
        if close.startswith("<["):
            rules.append(f"{name}: /{pattern}/")
            return f"{name} {close}"
        rules.append(f"{name}[suffix={close}]: /{pattern}/")
        return name

    def _tag(self, text: str) -> str:
        """A tag as the grammar writes it: its token when the vocabulary has one (llguidance takes
        every added token, special or not, for a token that never matches text), else its
        characters."""
        token = self._single_token(text)
        return lark_string(text) if token is None else f"<[{token}]>"

    def _single_token(self, text: str) -> int | None:
        return self._token_id(text)


class Constraint:
    """One choice's grammar: an llguidance matcher, closed until its gate token when the choice
    starts in reasoning."""

    def __init__(self, matcher: LLMatcher, gate_token: int | None, words: int):
        self.matcher = matcher
        self.waiting_for = gate_token
        self._mask = np.zeros(words, dtype=np.uint32)
        if matcher.is_error():
            raise ValueError(matcher.get_error())

    def next_mask(self) -> np.ndarray | None:
        """The allowed next tokens; None while the gate is closed (any token)."""
        if self.waiting_for is not None:
            return None
        self.matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        return self._mask

    def advance(self, token: int) -> None:
        if self.waiting_for is not None:
            if token == self.waiting_for:
                self.waiting_for = None
            return
        # The mask allowed it, so the matcher takes it; an error state would only mask EOS.
        self.matcher.consume_token(token)


def forced_tools(tool_choice, tools: list[dict] | None) -> list[dict]:
    """The tools a call must be made to: all of them for "required", one for a named choice."""
    if tool_choice is None or tool_choice in ("auto", "none"):
        return []
    if not tools:
        raise ApiError(400, "tool_choice forces a tool call but the request has no tools", param="tool_choice", code="invalid_value")
    if tool_choice == "required":
        return tools
    name = tool_choice.function.get("name")
    named = [t for t in tools if t["function"]["name"] == name]
    if not named:
        raise ApiError(400, f"tool_choice names '{name}', which is not among the request's tools", param="tool_choice",
                       code="invalid_value")
    return named


def inline_json(schema: dict) -> str:
    """A JSON schema as a Lark `%json` block, its whitespace bounded (llguidance's x-guidance)."""
    guided = dict(schema)
    guided["x-guidance"] = {**(schema.get("x-guidance") or {}), "whitespace_pattern": WHITESPACE, "lenient": False}
    return "%json " + json.dumps(guided, ensure_ascii=False)


def closed_objects(schema):
    """OpenAI's strict mode: objects allow no properties beyond those they list."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_objects(v) for k, v in schema.items()}
    if out.get("type") == "object" and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def lark_string(text: str) -> str:
    """A Lark string literal for `text` (JSON's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)
