"""Text + voice -> the talker's prompt layout, for every mode the checkpoints support.

A prompt is a sequence of positions. Each position carries a text part (a text token, projected
into the talker's width) and, optionally, a codec part: a codec token, the cloned speaker's
x-vector, or a whole reference frame (the sum of its 16 codebook embeddings). The talker's
input at a position is the sum of the two parts. After the prompt, the talker consumes
`trailing_text_ids` one token per frame, then the text-pad token.

The layout follows the reference implementation token for token:
  [instruction]  <|im_start|> user \n {instruction} <|im_end|> \n               (text only)
  [role]         <|im_start|> assistant \n                                     (text only)
  [codec tags]   pad.. bos  +  think/nothink, think_bos, (language), think_eos, (speaker), pad
  [first text]   text[0]    +  codec bos                      (streaming text)
  or the whole text + eos over codec pads, then pad + bos      (non-streaming text)
  or the reference text + text over the reference frames      (in-context voice cloning)

The control tokens of the chat template (<|im_start|>, <|im_end|>) and the tts_* tokens are placed
here by position; the text, the instruction and the reference text are read as characters only
(see ChatTemplate), so no user string can end the text or open a turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tts_service.model.configs import ModelConfig
from tts_service.model.text_tokenizer import ChatTemplate

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

NO_CODEC = -1
SPEAKER_SLOT = -2
REFERENCE_FRAME = -3


class PromptError(ValueError):
    """A request the loaded model cannot serve; `field` names the offending request field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[type[PromptError], tuple[str, str]]:
        return type(self), (self.field, self.message)


@dataclass(frozen=True)
class VoiceClone:
    """What voice cloning needs from the reference audio, computed once per reference."""

    speaker_embedding: object  # a torch tensor [hidden]; kept opaque so this module needs no torch
    reference_codes: tuple[tuple[int, ...], ...] | None  # frames x codebooks; None = x-vector only
    reference_text: str | None = None

    @property
    def is_in_context(self) -> bool:
        return self.reference_codes is not None


@dataclass(frozen=True)
class SynthesisInput:
    text: str
    language: str = "auto"
    speaker: str | None = None
    instruction: str | None = None
    clone: VoiceClone | None = None
    non_streaming_mode: bool = False


@dataclass(frozen=True)
class Prompt:
    text_ids: tuple[int, ...]
    codec_ids: tuple[int, ...]  # a codec token, NO_CODEC, SPEAKER_SLOT or REFERENCE_FRAME per position
    reference_codes: tuple[tuple[int, ...], ...]  # frames for the REFERENCE_FRAME positions, in order
    trailing_text_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.text_ids) != len(self.codec_ids):
            raise ValueError("text and codec parts must cover the same positions")

    @property
    def num_positions(self) -> int:
        return len(self.text_ids)


_ROLE_PREFIX_TOKENS = 3  # <|im_start|> assistant \n
_ROLE_SUFFIX_TOKENS = 5  # <|im_end|> \n <|im_start|> assistant \n
_REF_SUFFIX_TOKENS = 2  # <|im_end|> \n


class PromptBuilder:
    def __init__(self, config: ModelConfig, template: ChatTemplate) -> None:
        self.config = config
        self.talker = config.talker
        self.template = template

    @classmethod
    def for_tokenizer(cls, config: ModelConfig, tokenizer: PreTrainedTokenizerFast) -> PromptBuilder:
        return cls(config, ChatTemplate.for_tokenizer(tokenizer))

    # -- validation -------------------------------------------------------------------------

    def validate(self, request: SynthesisInput, is_text_required: bool = True) -> None:
        """Raise PromptError naming the field the loaded model cannot serve.

        `is_text_required=False` checks the voice alone, for a request whose text is still to come.
        """
        if is_text_required and not request.text.strip():
            raise PromptError("text", "must not be empty")
        language = request.language.lower()
        if language not in self.talker.languages:
            raise PromptError("language", f"unknown language {request.language!r}; "
                                          f"supported: {', '.join(self.talker.languages)}")
        model_type = self.config.model_type
        if request.speaker:
            if model_type != "custom_voice":
                raise PromptError("speaker", f"the loaded {model_type} model has no built-in speakers")
            if request.speaker.lower() not in self.talker.speaker_ids:
                raise PromptError("speaker", f"unknown speaker {request.speaker!r}; "
                                             f"supported: {', '.join(sorted(self.talker.speaker_ids))}")
        if request.instruction and not self.config.accepts_instruction:
            raise PromptError("instruction", f"the loaded {self.config.model_size} {model_type} model "
                                             "does not take instructions")
        if model_type == "base" and request.clone is None:
            raise PromptError("voice.reference_audio", "the loaded base model clones a voice: "
                                                       "reference audio is required")
        if request.clone is not None:
            if model_type != "base":
                raise PromptError("voice.reference_audio", f"the loaded {model_type} model cannot clone voices; "
                                                           "voice cloning needs a Base checkpoint")
            if request.clone.is_in_context and not (request.clone.reference_text or "").strip():
                raise PromptError("voice.reference_text", "in-context cloning needs the transcript of the "
                                                          "reference audio (or set x_vector_only)")

    # -- layout -----------------------------------------------------------------------------

    def assistant_token_ids(self, text: str) -> tuple[list[int], list[int]]:
        """(role ids, text ids), cut from one tokenization of the chat template, as the reference does."""
        ids = self.template.assistant_turn(text)
        return ids[:_ROLE_PREFIX_TOKENS], ids[_ROLE_PREFIX_TOKENS:-_ROLE_SUFFIX_TOKENS]

    @staticmethod
    def can_stream_text(request: SynthesisInput) -> bool:
        """Whether the layout can start before the whole text is known.

        Non-streaming text and in-context cloning place the whole text (and, for cloning, its
        length relative to the reference) in the prompt, so they wait for the complete text.
        """
        return not request.non_streaming_mode and not (request.clone is not None and request.clone.is_in_context)

    def build(self, request: SynthesisInput) -> Prompt:
        self.validate(request)
        role, text = self.assistant_token_ids(request.text)
        return self._build(request, role, text, is_text_complete=True)

    def build_open(self, request: SynthesisInput, first_text_ids: Sequence[int]) -> Prompt:
        """The prompt of a request whose text is still arriving, from its first committed text tokens.

        The trailing text holds the tokens after the first and no end-of-text token: the caller
        appends later tokens, then the end-of-text token when the input closes.
        """
        if not self.can_stream_text(request):
            raise ValueError("this layout needs the whole text; build() it once the input is closed")
        if not first_text_ids:
            raise ValueError("an open prompt needs at least one text token")
        self.validate(request, is_text_required=False)
        role = self.template.assistant_role()
        return self._build(request, role, list(first_text_ids), is_text_complete=False)

    def _build(self, request: SynthesisInput, role: list[int], text: list[int], is_text_complete: bool) -> Prompt:
        text_ids: list[int] = []
        codec_ids: list[int] = []

        def add(texts: Sequence[int], codecs: Sequence[int] | None = None) -> None:
            text_ids.extend(texts)
            codec_ids.extend(codecs if codecs is not None else [NO_CODEC] * len(texts))

        if request.instruction:
            add(self.template.instruction_turn(request.instruction))
        add(role)

        tags = self._codec_tags(request)
        pad, bos, eos = self.config.tts_pad_token_id, self.config.tts_bos_token_id, self.config.tts_eos_token_id
        add([pad] * (len(tags) - 2) + [bos], tags[:-1])

        if request.clone is not None and request.clone.is_in_context:
            return self._in_context(request, text, text_ids, codec_ids)
        if request.non_streaming_mode:
            add([*text, eos], [self.talker.codec_pad_id] * (len(text) + 1))
            add([pad], [self.talker.codec_bos_id])
            trailing: list[int] = []
        else:
            add(text[:1], [self.talker.codec_bos_id])
            trailing = [*text[1:], eos] if is_text_complete else text[1:]
        return Prompt(tuple(text_ids), tuple(codec_ids), (), tuple(trailing))

    def _codec_tags(self, request: SynthesisInput) -> list[int]:
        """think/nothink, think_bos, (language), think_eos, (speaker), pad, bos."""
        talker = self.talker
        language_id = self._language_id(request)
        if language_id is None:
            tags = [talker.codec_nothink_id, talker.codec_think_bos_id, talker.codec_think_eos_id]
        else:
            tags = [talker.codec_think_id, talker.codec_think_bos_id, language_id, talker.codec_think_eos_id]
        if request.clone is not None:
            tags.append(SPEAKER_SLOT)
        elif request.speaker:
            tags.append(talker.speaker_ids[request.speaker.lower()])
        return [*tags, talker.codec_pad_id, talker.codec_bos_id]

    def _language_id(self, request: SynthesisInput) -> int | None:
        language = request.language.lower()
        if request.speaker and request.clone is None and language in ("chinese", "auto"):
            dialect = self.talker.speaker_dialects.get(request.speaker.lower())
            if dialect is not None:
                return self.talker.codec_language_ids[dialect]
        return None if language == "auto" else self.talker.codec_language_ids[language]

    def _in_context(self, request: SynthesisInput, text: list[int], text_ids: list[int],
                    codec_ids: list[int]) -> Prompt:
        clone = request.clone
        assert clone is not None and clone.reference_codes is not None and clone.reference_text is not None
        reference = self.template.reference_turn(clone.reference_text)
        pad, eos = self.config.tts_pad_token_id, self.config.tts_eos_token_id
        icl_text = [*reference[_ROLE_PREFIX_TOKENS:-_REF_SUFFIX_TOKENS], *text, eos]
        icl_codec = [self.talker.codec_bos_id] + [REFERENCE_FRAME] * len(clone.reference_codes)
        if request.non_streaming_mode:
            text_ids += [*icl_text, *([pad] * len(icl_codec))]
            codec_ids += [*([self.talker.codec_pad_id] * len(icl_text)), *icl_codec]
            trailing: list[int] = []
        elif len(icl_text) > len(icl_codec):
            text_ids += icl_text[:len(icl_codec)]
            codec_ids += icl_codec
            trailing = icl_text[len(icl_codec):]
        else:
            text_ids += [*icl_text, *([pad] * (len(icl_codec) - len(icl_text)))]
            codec_ids += icl_codec
            trailing = []
        return Prompt(tuple(text_ids), tuple(codec_ids), clone.reference_codes, tuple(trailing))
