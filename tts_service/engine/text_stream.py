"""Text that arrives in fragments (LLM tokens) -> the ids one tokenization of the whole text gives.

A BPE tokenizer never merges across pre-token boundaries (the pre-tokenizer's regex splits text
into words, numbers, punctuation runs and whitespace runs), so every pre-token but the last one
of the text received so far is final: later text can only extend or re-split the last one.
Tokens are therefore committed up to the start of the last pre-token, and the rest waits for
more text or for the end of the input. The pre-tokenizer runs on NFC-normalised text, as the
tokenizer does, so a combining mark in the next fragment still joins the letter before it.

Added tokens are the one thing that would cross pre-token boundaries (`<|im_end|>` is several
pre-tokens, one added token), so every piece is encoded with them switched off, as the prompt
builder encodes the whole text: a fragment boundary inside `<|im_end|>` changes nothing, and the
text never yields a control id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tts_service.model.text_tokenizer import literal_text_encoder

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

Tokenize = Callable[[str], list[int]]
PreTokenStarts = Callable[[str], list[int]]
Normalize = Callable[[str], str]


@dataclass(frozen=True)
class TextTokenization:
    """How to tokenize: the first piece of a text (within its chat template) and later pieces (bare)."""

    tokenize_first: Tokenize
    tokenize_rest: Tokenize
    pre_token_starts: PreTokenStarts
    normalize: Normalize

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerFast, tokenize_first: Tokenize) -> TextTokenization:
        """From a Hugging Face fast tokenizer; `tokenize_first` is the prompt builder's text tokenization."""
        backend = tokenizer.backend_tokenizer
        pre_tokenizer = backend.pre_tokenizer
        normalizer = backend.normalizer

        def pre_token_starts(text: str) -> list[int]:
            return [start for _, (start, _) in pre_tokenizer.pre_tokenize_str(text)]

        def normalize(text: str) -> str:
            return normalizer.normalize_str(text) if normalizer is not None else text

        return cls(tokenize_first, literal_text_encoder(tokenizer), pre_token_starts, normalize)


class IncrementalTokenizer:
    """Commits the token ids of a growing text as soon as later text can no longer change them."""

    def __init__(self, tokenization: TextTokenization) -> None:
        self._tokenization = tokenization
        self._pending = ""
        self._is_first_piece = True
        self.is_closed = False

    @property
    def pending_text(self) -> str:
        return self._pending

    def append(self, fragment: str) -> list[int]:
        """Add a fragment; returns the ids that became final (possibly none)."""
        if self.is_closed:
            raise ValueError("text arrived after the input was closed")
        self._pending = self._tokenization.normalize(self._pending + fragment)
        starts = self._tokenization.pre_token_starts(self._pending)
        if len(starts) < 2:
            return []
        boundary = starts[-1]
        committed, self._pending = self._pending[:boundary], self._pending[boundary:]
        return self._tokenize(committed)

    def close(self) -> list[int]:
        """End of input: returns the ids of the text still held back."""
        if self.is_closed:
            return []
        self.is_closed = True
        committed, self._pending = self._pending, ""
        return self._tokenize(committed) if committed else []

    def _tokenize(self, text: str) -> list[int]:
        if self._is_first_piece:
            self._is_first_piece = False
            return self._tokenization.tokenize_first(text)
        return self._tokenization.tokenize_rest(text)
