"""Text in and out: the checkpoint's tokenizer.json through HF `tokenizers`, its chat template
rendered in jinja2's sandbox the way transformers renders it, incremental detokenization that
never emits half a UTF-8 character, and stop strings that may span tokens."""
from __future__ import annotations

import datetime
import json
import pathlib
from collections.abc import Sequence

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer as HfTokenizer


class TemplateError(ValueError):
    """The chat template refused the conversation (its raise_exception) or failed to render."""


class Tokenizer:
    def __init__(self, model_dir: str | pathlib.Path):
        model_dir = pathlib.Path(model_dir)
        self.json_text = (model_dir / "tokenizer.json").read_text()
        self._tokenizer = HfTokenizer.from_str(self.json_text)
        config_path = model_dir / "tokenizer_config.json"
        self.config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        template_path = model_dir / "chat_template.jinja"
        self.chat_template = template_path.read_text() if template_path.is_file() else self.config.get("chat_template")
        if isinstance(self.chat_template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in self.chat_template}
            self.chat_template = named.get("default") or next(iter(named.values()), None)
        self._template = _environment().from_string(self.chat_template) if self.chat_template else None
        added = self._tokenizer.get_added_tokens_decoder()
        self.special_ids = {i for i, t in added.items() if t.special}
        self._added = set(added)
        spec = json.loads(self.json_text)
        decoder = spec.get("decoder") or {}
        self.max_token_bytes = _max_token_bytes(spec, self._tokenizer) if spec.get("normalizer") is None else None
        self._byte_level = decoder.get("type") == "ByteLevel" or any(
            d.get("type") == "ByteLevel" for d in decoder.get("decoders", []) if isinstance(d, dict))

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, text: str) -> int | None:
        return self._tokenizer.token_to_id(text)

    def encode(self, text: str) -> list[int]:
        """Special tokens written in the text ([gMASK], <|user|>, ...) become their ids; nothing
        is added (GLM has no automatic BOS: the template writes [gMASK]<sop>). Through
        encode_batch, which releases the GIL (encode holds it): a server tokenizing a huge prompt
        in a worker thread keeps answering on its event loop."""
        return self._tokenizer.encode_batch([text], add_special_tokens=False)[0].ids

    def tokens_at_least(self, text: str) -> int:
        """A lower bound on len(encode(text)), without encoding: every token stands for at most
        max_token_bytes of the text when no normalizer rewrites it first (0 when one does). Lets
        a server refuse a prompt far beyond its context before spending seconds tokenizing it."""
        if not self.max_token_bytes:
            return 0
        return -(-len(text.encode("utf-8", "surrogatepass")) // self.max_token_bytes)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    add_generation_prompt: bool = True, **template_kwargs) -> str:
        if self._template is None:
            raise TemplateError("this checkpoint has no chat template")
        try:
            return self._template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                         **self._special_token_strings(), **template_kwargs)
        except TemplateError:
            raise
        except jinja2.TemplateError as error:
            raise TemplateError(f"chat template failed: {error}") from None

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    add_generation_prompt: bool = True, **template_kwargs) -> list[int]:
        return self.encode(self.render_chat(messages, tools, add_generation_prompt, **template_kwargs))

    def _special_token_strings(self) -> dict:
        out = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = self.config.get(key)
            out[key] = value.get("content") if isinstance(value, dict) else value
        return out

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes one token stands for (byte-level BPE maps bytes to printable characters)."""
        piece = self._tokenizer.id_to_token(token)
        if piece is None:
            return b""
        if token in self._added or not self._byte_level:
            return self.decode([token]).encode("utf-8", "replace") if token not in self._added else piece.encode()
        return bytes(_UNICODE_TO_BYTE.get(ch, ord("?")) for ch in piece)

    def detokenizer(self, skip_special_tokens: bool = False) -> "Detokenizer":
        return Detokenizer(self, skip_special_tokens)


def _max_token_bytes(spec: dict, tokenizer: HfTokenizer) -> int | None:
    """The most bytes one token covers: a byte-level vocabulary's pieces are one character per
    byte; added tokens match their text. None where the vocabulary is of another kind."""
    pre = spec.get("pre_tokenizer") or {}
    kinds = [pre.get("type")] + [p.get("type") for p in pre.get("pretokenizers", []) if isinstance(p, dict)]
    if "ByteLevel" not in kinds:
        return None
    longest = max((len(piece) for piece in tokenizer.get_vocab(with_added_tokens=False)), default=1)
    added = [token.content.encode("utf-8") for token in tokenizer.get_added_tokens_decoder().values()]
    return max([longest, *map(len, added)])


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters, used by byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, codes)))


_UNICODE_TO_BYTE = {ch: byte for byte, ch in _bytes_to_unicode().items()}


def _raise_exception(message: str):
    raise TemplateError(message)


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    """As transformers builds it: trim_blocks, lstrip_blocks, loop controls, tojson without ASCII
    escaping, raise_exception and strftime_now."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


class Detokenizer:
    """Turns a growing list of token ids into text deltas. Text is held back while the newest tokens
    end inside a UTF-8 character (decode yields U+FFFD there), so no delta splits a character."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        self._prefix_offset = 0  # tokens decoded only as context for the next delta
        self._read_offset = 0  # tokens whose text has been emitted

    def add(self, token: int) -> str:
        self.ids.append(token)
        decode = lambda ids: self._tokenizer.decode(ids, self._skip)  # noqa: E731
        prefix = decode(self.ids[self._prefix_offset:self._read_offset])
        full = decode(self.ids[self._prefix_offset:])
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""  # an incomplete character, or a token with no text yet
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.ids)
        return full[len(prefix):]

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        rest = self._tokenizer.decode(self.ids[self._read_offset:], self._skip) if self._read_offset < len(self.ids) else ""
        self._prefix_offset = self._read_offset = len(self.ids)
        return rest


class StopMatcher:
    """Finds stop strings in streamed text. `feed` returns (text safe to emit, stopped): text that
    could still be the start of a stop string is held back until it cannot be."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, delta: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        text = self._held + delta
        hits = [(text.find(s), s) for s in self.stops if s in text]
        if hits:
            at, self.matched = min(hits)
            self._held, self.stopped = "", True
            return text[:at], True
        keep = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:length]):
                    keep = max(keep, length)
                    break
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held
