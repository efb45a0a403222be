"""The text tokenizer of a Qwen3-TTS checkpoint: loading one, and writing a small working stand-in.

Published checkpoints ship a Qwen2 byte-level BPE tokenizer as `vocab.json`, `merges.txt` and
`tokenizer_config.json` (no `tokenizer.json`), so `transformers` converts it to a fast tokenizer
at load time. Random-weight checkpoints need the same three files, so `write_text_tokenizer`
trains a byte-level BPE on a small built-in multilingual corpus and lays the special tokens out
exactly where the checkpoint's config expects them.

Two facts about that conversion shape the layout:
  * Ids in `added_tokens_decoder` are not honoured: the converted tokenizer appends the added
    tokens, in id order, right after `vocab.json`. So the regular vocabulary is padded with
    unreachable filler entries up to the first special id, and every gap inside the special
    block is filled too (with the published Qwen3-TTS specials where they fit).
  * The reference loads with `fix_mistral_regex=True`, which in transformers 4.57.3 (its pinned
    version) swaps the Qwen pre-tokenizer regex for Mistral's (it also splits at case changes:
    "iPhone" -> "i", "Phone") when the vocabulary exceeds 100k tokens and the directory's
    `config.json` has no `transformers_version` or one in (4.57.2, 5.0). transformers 5.x changed
    that rule (5.23 never swaps for a Qwen3-TTS `model_type`), so `load_text_tokenizer` asks for no
    swap and applies 4.57.3's rule itself: the service cuts text into the reference's ids on every
    release.

User text never becomes a control token: `ChatTemplate` places the chat template's control ids
itself and encodes the text between them with `literal_text_encoder`, which knows no added tokens.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tts_service.model.configs import MODEL_CONFIG_FILE, ConfigSection

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
CONFIG_FILE = "tokenizer_config.json"
FAST_FILE = "tokenizer.json"

# Short names used by checkpoint configs (`im_start_token_id`, ...) for the special tokens' text.
SPECIAL_TOKEN_NAMES: dict[str, str] = {
    "endoftext": "<|endoftext|>",
    "im_start": "<|im_start|>",
    "im_end": "<|im_end|>",
    "tts_pad": "<tts_pad>",
    "tts_bos": "<tts_text_bos>",
    "tts_eos": "<tts_text_eod>",
}

# The special block of the published tokenizer, in id order from <|endoftext|> (151643). The
# tool-call and thinking tags are added tokens that Qwen does not mark special, so decoding with
# skip_special_tokens keeps them.
PUBLISHED_SPECIAL_BLOCK: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", True), ("<|fim_middle|>", True), ("<|fim_suffix|>", True), ("<|fim_pad|>", True),
    ("<|repo_name|>", True), ("<|file_sep|>", True), ("<tool_response>", False),
    ("</tool_response>", False), ("<think>", False), ("</think>", False), ("<|audio_start|>", True),
    ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True), ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True), ("<|audio_pad|>", True),
)

# The model slices prompts assuming these are one token each.
SINGLE_TOKEN_WORDS = ("assistant", "user", "system")

# Qwen2's pre-tokenizer split, as transformers' Qwen2 converter installs it, so the merges are
# learned on the same pieces the loaded tokenizer sees (the Mistral swap only cuts some finer).
QWEN2_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# The split transformers 4.57.3 swaps in (see the module docstring), verbatim, and the rule for when.
MISTRAL_SPLIT_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MISTRAL_SWAP_MIN_VOCAB = 100_000
_MISTRAL_MODEL_TYPES = ("mistral", "mistral3", "voxtral", "ministral", "pixtral")
_LAST_RELEASE_BEFORE_THE_SWAP = Version("4.57.2")
_FIRST_RELEASE_WITHOUT_THE_SWAP = Version("5.0.0")
BYTE_ALPHABET_SIZE = 256
# The corpus is small, so pairs seen once are merged too; merges are still ordered by frequency,
# so a smaller vocabulary keeps the common pieces.
MIN_PAIR_FREQUENCY = 1
# In byte-level characters. Caps what a pair seen once can grow into: without it, unspaced Chinese
# and Japanese clauses become single tokens. Four CJK characters or a long word still fit.
MAX_TOKEN_LENGTH = 12
# Regular-vocabulary entries between the trained tokens and the first special id.
FILLER_PREFIX = "<|unused_"
MODEL_MAX_LENGTH = 131072
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Written for this module: a few sentences per language the model speaks, the roles of the chat
# template, numbers, punctuation and emoji.
TRAINING_CORPUS = """\
user
Read this sentence slowly, with a warm and friendly voice.
assistant
Of course. Here is the sentence, read slowly and warmly.
system
You are a voice that reads text aloud clearly and naturally.
user
Please speak like a sports commentator who is very excited about the final minute.
assistant
And the ball is in the air, the crowd is on its feet, what a finish this is!
The weather today will be sunny in the morning and cloudy in the afternoon.
Our train leaves the station at half past seven, so we should not be late.
She opened the window, listened to the rain, and smiled at the quiet street.
Thank you for calling. Your order number is 4821, and it will arrive on Tuesday.
Could you tell me where the nearest library is? I would like to borrow a book.
The quick brown fox jumps over the lazy dog while the children are laughing.
He watched a YouTube video about the new iPhone and the PlayStation at McDonald's.
Don't worry, we'll finish the project together; it's going to be fine.
Speak in a calm, low voice, as if you were telling a bedtime story.
A young woman with a bright and clear voice, speaking a little faster than usual.
An old man with a deep, rough voice, pausing often between his words.
system
今天天气很好，我们一起去公园散步吧。
请用温柔的声音朗读这段文字，语速慢一点。
这家餐厅的饺子非常好吃，每天中午都有很多人排队。
我明天早上八点要去机场，航班是下午两点起飞。
他一边听音乐，一边在窗边看书，觉得很放松。
欢迎收听今天的新闻，接下来为您播报天气情况。
学习一门新的语言需要时间和耐心，但是非常有意思。
user
今日はとても良い天気ですね。一緒に散歩に行きませんか。
駅までの道を教えていただけますか。少し迷ってしまいました。
このお茶はとても美味しいです。もう一杯いただけますか。
明日の会議は午後三時から始まりますので、よろしくお願いします。
優しい声でゆっくりと読んでください。
オレンジジュースとコーヒーを一つずつお願いします。
assistant
오늘 날씨가 정말 좋네요. 같이 공원에 산책하러 갈까요?
이 문장을 천천히 그리고 부드러운 목소리로 읽어 주세요.
내일 아침 아홉 시에 회의가 있으니 늦지 마세요.
저는 한국 음식을 좋아해요. 특히 김치찌개를 자주 먹어요.
도서관은 이 길을 따라 쭉 가시면 오른쪽에 있습니다.
system
Heute ist das Wetter wunderschön, wollen wir zusammen spazieren gehen?
Bitte lies diesen Satz langsam und mit einer freundlichen Stimme vor.
Der Zug nach München fährt um halb acht von Gleis drei ab.
Ich hätte gern einen Kaffee und ein Stück Apfelkuchen, bitte.
Die Kinder spielen im Garten, während die Großeltern Tee trinken.
user
Aujourd'hui, il fait beau : allons nous promener au bord de la rivière.
Lis cette phrase lentement, avec une voix douce et chaleureuse, s'il te plaît.
Le train pour Lyon part à huit heures et quart, ne sois pas en retard.
Je voudrais un café crème et un croissant, s'il vous plaît.
Les enfants écoutent une histoire avant de s'endormir.
assistant
Hoy hace un día precioso, ¿vamos a pasear por el parque?
Lee esta frase despacio, con una voz cálida y amable, por favor.
El tren a Madrid sale a las ocho y media desde el andén dos.
¿Dónde está la biblioteca más cercana? Quiero pedir prestado un libro.
Mis abuelos viven en un pueblo pequeño cerca del mar.
system
Oggi il tempo è bellissimo, andiamo a fare una passeggiata?
Leggi questa frase lentamente, con una voce calda e gentile, per favore.
Il treno per Roma parte alle otto e mezza dal binario quattro.
Vorrei un cappuccino e una brioche, grazie mille.
I bambini giocano in piazza mentre i nonni chiacchierano.
user
Hoje o tempo está lindo, vamos dar um passeio no parque?
Leia esta frase devagar, com uma voz calma e simpática, por favor.
O ônibus para São Paulo sai às oito e meia da estação central.
Eu gostaria de um café com leite e um pão de queijo, por favor.
As crianças estão brincando no jardim enquanto a avó prepara o almoço.
assistant
Сегодня прекрасная погода, давай пойдём гулять в парк.
Пожалуйста, прочитай это предложение медленно и спокойным голосом.
Поезд в Москву отправляется в половине восьмого с третьего пути.
Я хотел бы чашку чая с лимоном и кусок пирога.
Дети играют во дворе, а бабушка читает книгу у окна.
system
Où êtes-vous ? Le garçon a goûté la bûche de Noël à côté de sa sœur, près du canapé.
Ça alors ! Élodie et François arrivent à Besançon dès l'aube.
¡Está aquí! Él comió un plátano en Perú; Ángela llegó después.
Não, as lições são às três horas, e a avó põe pão na mesa.
Più tardi andrò in città, così vedrò la nuova libreria.
Österreich, Übungen und Äpfel: Jürgen übt täglich Klavier.
0 1 2 3 4 5 6 7 8 9 10 25 100 365 2024 3.14 1,000,000 50% 12:30 +86 (555) 010-2030
Prices: $19.99, €45, £7.50, ¥1200, ₩5000. Dates: 2025-01-31, 31/01/2025.
Punctuation: , . ; : ! ? ... — – - ( ) [ ] { } " ' « » „ “ ” 「 」 『 』 ， 。 、 ！ ？ ： ；
Emoji: 😀 😂 🙂 😢 😡 👍 👋 🙏 🎉 🎵 🎶 ❤️ 🌧️ ☀️ 🌙 ⭐ 🚆 ☕ 🍜 🍣 📚 🔊 🎤 🐱 🐶
Great job! 👏 See you tomorrow 😊 Happy birthday 🎂🎉 Good night 🌙✨
"""


class TextTokenizerError(ValueError):
    """The special-token layout cannot be written, or the written tokenizer breaks a guarantee."""


@dataclass(frozen=True)
class _AddedToken:
    content: str
    special: bool


# -- writing ------------------------------------------------------------------------------------


def write_text_tokenizer(directory: Path, special_token_ids: Mapping[str, int], vocab_size: int) -> None:
    """Write `vocab.json`, `merges.txt` and `tokenizer_config.json` for a working tokenizer.

    `special_token_ids` maps a short name (`im_start`, see SPECIAL_TOKEN_NAMES) or a token's text
    (`<|im_start|>`) to the id it must encode to; `vocab_size` is the text embedding's size. The
    regular vocabulary fills every id below the smallest special id. The files are the same bytes
    for the same arguments.
    """
    specials = _resolve_special_ids(special_token_ids, vocab_size)
    first_special = min(specials.values())
    added = _special_block(specials, vocab_size)
    trained_vocab, merges = _train_bpe(first_special)
    vocab_json = _vocab_json(trained_vocab, first_special, (token.content for token in added.values()))
    directory.mkdir(parents=True, exist_ok=True)
    _write_text(directory / VOCAB_FILE, vocab_json)
    _write_text(directory / MERGES_FILE, "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    config = json.dumps(_tokenizer_config(added), ensure_ascii=False, indent=2)
    _write_text(directory / CONFIG_FILE, config + "\n")


def _resolve_special_ids(special_token_ids: Mapping[str, int], vocab_size: int) -> dict[str, int]:
    resolved: dict[str, int] = {}
    for name, token_id in special_token_ids.items():
        content = SPECIAL_TOKEN_NAMES.get(name, name)
        if not (content.startswith("<") and content.endswith(">")):
            raise TextTokenizerError(f"unknown special token {name!r}: use one of "
                                     f"{sorted(SPECIAL_TOKEN_NAMES)} or the token's own text, "
                                     "such as '<|im_start|>'")
        if not 0 <= token_id < vocab_size:
            raise TextTokenizerError(f"special token {content} at id {token_id} is outside the vocabulary "
                                     f"of {vocab_size}")
        if resolved.setdefault(content, token_id) != token_id:
            raise TextTokenizerError(f"special token {content} is given two ids")
    if not resolved:
        raise TextTokenizerError("at least one special token id is needed")
    taken = sorted(resolved.values())
    if len(set(taken)) != len(taken):
        raise TextTokenizerError(f"two special tokens share an id: {special_token_ids}")
    return resolved


def _special_block(specials: Mapping[str, int], vocab_size: int) -> dict[int, _AddedToken]:
    """Every id from the first special to the end of the published block (or the last requested id).

    A hole takes the published token of that offset unless that token is placed elsewhere; anything
    still empty gets a reserved placeholder, because the converted tokenizer numbers added tokens
    consecutively and a hole would shift every later special.
    """
    first = min(specials.values())
    end = max(max(specials.values()) + 1, min(first + len(PUBLISHED_SPECIAL_BLOCK), vocab_size))
    published_flags = dict(PUBLISHED_SPECIAL_BLOCK)
    block = {token_id: _AddedToken(content, published_flags.get(content, True))
             for content, token_id in specials.items()}
    placed = set(specials)
    for offset, (content, special) in enumerate(PUBLISHED_SPECIAL_BLOCK):
        token_id = first + offset
        if token_id < end and token_id not in block and content not in placed:
            block[token_id] = _AddedToken(content, special)
            placed.add(content)
    for token_id in range(first, end):
        block.setdefault(token_id, _AddedToken(f"<|reserved_special_{token_id}|>", True))
    return dict(sorted(block.items()))


def _train_bpe(max_vocab: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    if max_vocab < BYTE_ALPHABET_SIZE:
        raise TextTokenizerError(f"the first special id must leave room for the {BYTE_ALPHABET_SIZE} byte "
                                 f"tokens, got {max_vocab}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = _qwen2_pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=max_vocab,
        min_frequency=MIN_PAIR_FREQUENCY,
        max_token_length=MAX_TOKEN_LENGTH,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_sequences(tokenizer.pre_tokenizer), trainer)
    _require_single_tokens(tokenizer, SINGLE_TOKEN_WORDS, max_vocab)
    model = json.loads(tokenizer.to_str())["model"]
    return dict(model["vocab"]), [(a, b) for a, b in model["merges"]]


def _qwen2_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _training_sequences(pre_tokenizer: pre_tokenizers.PreTokenizer) -> list[str]:
    """The corpus, plus each multi-byte character alone, repeated.

    Repeated once more than the corpus's most frequent byte pair, the pairs inside a character
    outrank every other pair, so each character is whole before any merge reaches across into the
    next one: tokens then split Chinese or emoji between characters, never inside one.
    """
    lines = TRAINING_CORPUS.splitlines()
    weight = _most_frequent_pair_count(lines, pre_tokenizer) + 1
    characters = sorted({char for char in TRAINING_CORPUS if len(char.encode()) > 1})
    # One sequence per copy: joined by any separator, the pre-tokenizer would glue some (punctuation,
    # emoji) to it and boost that pair instead.
    return [*lines, *(char for char in characters for _ in range(weight))]


def _most_frequent_pair_count(lines: Iterable[str], pre_tokenizer: pre_tokenizers.PreTokenizer) -> int:
    counts: Counter[tuple[str, str]] = Counter()
    for line in lines:
        for piece, _ in pre_tokenizer.pre_tokenize_str(line):
            counts.update(pairwise(piece))
    return max(counts.values())


def _require_single_tokens(tokenizer: Tokenizer, words: Iterable[str], max_vocab: int) -> None:
    for word in words:
        pieces = tokenizer.encode(word).tokens
        if len(pieces) != 1:
            raise TextTokenizerError(f"with {max_vocab} regular tokens, {word!r} splits into {pieces}; "
                                     "the prompt layout needs it to be one token")


def _vocab_json(vocab: Mapping[str, int], size: int, special_contents: Iterable[str]) -> str:
    """The trained vocabulary in id order, then fillers that no merge produces, up to `size` entries.

    The fillers only push the specials to their configured ids. They are appended as text because
    serialising 150k entries through `json` would take most of the time budget.
    """
    ordered = dict(sorted(vocab.items(), key=lambda item: item[1]))
    if list(ordered.values()) != list(range(len(ordered))):
        raise TextTokenizerError("the trained vocabulary does not number its tokens consecutively")
    specials = set(special_contents)
    clashes = [token for token in (*ordered, *specials) if token.startswith(FILLER_PREFIX)]
    # An added token already in vocab.json would keep that id instead of its configured one.
    clashes += sorted(specials.intersection(ordered))
    if clashes:
        raise TextTokenizerError(f"tokens {clashes} collide with the regular vocabulary or its fillers")
    trained = json.dumps(ordered, ensure_ascii=False, separators=(",", ":"))
    fillers = "".join(f',"{FILLER_PREFIX}{token_id}|>":{token_id}' for token_id in range(len(ordered), size))
    return trained[:-1] + fillers + "}"


def _tokenizer_config(added: Mapping[int, _AddedToken]) -> dict[str, Any]:
    contents = {token.content for token in added.values()}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(token_id): {"content": token.content, "lstrip": False, "normalized": False, "rstrip": False,
                            "single_word": False, "special": token.special}
            for token_id, token in added.items()
        },
        "additional_special_tokens": [token.content for token in added.values()
                                      if token.special and token.content != PAD_TOKEN],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN if EOS_TOKEN in contents else None,
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": PAD_TOKEN if PAD_TOKEN in contents else None,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def _write_text(path: Path, text: str) -> None:
    # Fixed newlines and encoding keep the bytes identical on every platform.
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)


# -- loading ------------------------------------------------------------------------------------


def load_text_tokenizer(directory: Path) -> PreTrainedTokenizerFast:
    """The checkpoint's text tokenizer, loaded exactly as the reference loads it.

    Accepts the published layout (`vocab.json` + `merges.txt` + `tokenizer_config.json`) and also
    a directory that carries `tokenizer.json` instead of the first two. A missing file raises
    FileNotFoundError, a broken one TextTokenizerError; both name the file.
    """
    # Imported here: transformers takes seconds to import and writing a tokenizer never needs it.
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    directory = Path(directory)
    missing = _missing_tokenizer_files(directory)
    if missing:
        raise FileNotFoundError(f"{directory}: the text tokenizer file(s) {', '.join(missing)} "
                                "are missing")
    swaps_split = reference_swaps_in_mistral_split(directory)
    try:
        # Whether transformers swaps the split depends on its release; False makes every release leave it
        # (and keeps it from warning), and the reference's choice is applied below.
        tokenizer = AutoTokenizer.from_pretrained(str(directory), fix_mistral_regex=False)
    except Exception as error:
        # A broken file surfaces from transformers or the tokenizers library as anything from a
        # JSONDecodeError to a bare Exception, and none of them says which file it was.
        _check_tokenizer_files(directory)
        raise TextTokenizerError(f"{directory}: the text tokenizer does not load: {error}") from error
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise TextTokenizerError(f"{directory}: expected a fast tokenizer, got {type(tokenizer).__name__}")
    if swaps_split and tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=False) > MISTRAL_SWAP_MIN_VOCAB:
        _swap_in_mistral_split(tokenizer, directory)
    return tokenizer


def reference_swaps_in_mistral_split(directory: Path) -> bool:
    """Whether transformers 4.57.3, loading `directory` with `fix_mistral_regex=True` as the reference
    does, swaps in the Mistral split (given a vocabulary over MISTRAL_SWAP_MIN_VOCAB).

    Its rule (`_patch_mistral_regex`): only with a `config.json`, and then unless that names a
    `transformers_version` of 5.0 or later, or one up to 4.57.2 together with a non-Mistral `model_type`.
    """
    path = directory / MODEL_CONFIG_FILE
    if not path.is_file():
        return False
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError both
        raise TextTokenizerError(f"{path}: not valid UTF-8 JSON: {error}") from error
    config = ConfigSection(raw, MODEL_CONFIG_FILE)
    has_model_type = config.raw.get("model_type") is not None
    model_type = config.string("model_type", "")
    version_text = config.string("transformers_version", "")
    if not version_text:
        return True
    try:
        version = Version(version_text)
    except InvalidVersion as error:
        raise config.error("transformers_version", f"is not a version: {version_text!r}") from error
    if version <= _LAST_RELEASE_BEFORE_THE_SWAP:
        return not has_model_type or model_type in _MISTRAL_MODEL_TYPES
    return version < _FIRST_RELEASE_WITHOUT_THE_SWAP


def _swap_in_mistral_split(tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    pre_tokenizer = tokenizer.backend_tokenizer.pre_tokenizer
    if not isinstance(pre_tokenizer, pre_tokenizers.Sequence):
        # 4.57.3 assigns to the first step of a Sequence, which any other pre-tokenizer refuses: the
        # reference cannot load such a directory either.
        raise TextTokenizerError(f"{directory}: the reference replaces the first step of the pre-tokenizer "
                                 f"sequence, but this tokenizer's pre-tokenizer is {type(pre_tokenizer).__name__}")
    pre_tokenizer[0] = pre_tokenizers.Split(Regex(MISTRAL_SPLIT_PATTERN), behavior="isolated")


def _missing_tokenizer_files(directory: Path) -> list[str]:
    needed = [CONFIG_FILE]
    if not (directory / FAST_FILE).is_file():
        needed += [VOCAB_FILE, MERGES_FILE]
    return [name for name in needed if not (directory / name).is_file()]


def _check_tokenizer_files(directory: Path) -> None:
    """Raise TextTokenizerError naming the first tokenizer file that is broken on its own.

    Runs only after a failed load, so reading the files a second time costs nothing on the normal path.
    """
    _read_json_object(directory / CONFIG_FILE)
    fast_path = directory / FAST_FILE
    if fast_path.is_file():
        try:
            Tokenizer.from_file(str(fast_path))
        except Exception as error:  # the tokenizers library raises bare Exceptions
            raise TextTokenizerError(f"{fast_path}: not a tokenizer the tokenizers library reads: {error}") from error
        return
    vocab_path = directory / VOCAB_FILE
    vocab = _read_json_object(vocab_path)
    not_ids = [token for token, token_id in vocab.items() if not isinstance(token_id, int)]
    if not_ids:
        raise TextTokenizerError(f"{vocab_path}: token {not_ids[0]!r} has no integer id")
    _check_merges(directory / MERGES_FILE, vocab)


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError both
        raise TextTokenizerError(f"{path}: not valid UTF-8 JSON: {error}") from error
    if not isinstance(value, dict):
        raise TextTokenizerError(f"{path}: expected a JSON object, found a {type(value).__name__}")
    return value


def _check_merges(path: Path, vocab: Mapping[str, int]) -> None:
    """Each line is two tokens whose concatenation is a token too, as the BPE model requires."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise TextTokenizerError(f"{path}: not UTF-8 text: {error}") from error
    for number, line in enumerate(lines, start=1):
        # Skipped as the Qwen2 tokenizer reads the file: the version header and blank lines.
        if not line.strip() or (number == 1 and line.startswith("#version:")):
            continue
        pair = line.split()
        if len(pair) != 2:
            raise TextTokenizerError(f"{path}: line {number} is not a pair of tokens: {line!r}")
        unknown = [token for token in (*pair, "".join(pair)) if token not in vocab]
        if unknown:
            raise TextTokenizerError(f"{path}: line {number} needs {unknown[0]!r}, which {VOCAB_FILE} does not hold")


# -- encoding user text -----------------------------------------------------------------------------


def literal_text_encoder(tokenizer: PreTrainedTokenizerFast) -> Callable[[str], list[int]]:
    """Text -> ids, as the tokenizer would cut it if it had no added tokens.

    Text that spells `<|im_end|>`, `<tts_text_eod>` or `<think>` gets the ids of its characters,
    never the control id. Text that spells no added token gets exactly the ids `tokenizer` gives it:
    a tokenizer only cuts its input at added tokens before normalising, pre-tokenizing and running
    BPE, and those stages are shared here, the loaded pre-tokenizer (Mistral regex swap and all)
    included. `split_special_tokens=True` would not do: the fast tokenizer then still matches the
    added tokens Qwen does not mark special (`<think>`, `<tool_call>`, ...), while the slow one
    matches none, so the two paths would disagree.
    """
    backend = tokenizer.backend_tokenizer
    # Built around the loaded model, not copied, so this costs microseconds per tokenizer.
    literal = Tokenizer(backend.model)
    literal.normalizer = backend.normalizer
    literal.pre_tokenizer = backend.pre_tokenizer

    def encode(text: str) -> list[int]:
        return literal.encode(text, add_special_tokens=False).ids

    return encode


@dataclass(frozen=True)
class ChatTemplate:
    """The reference's chat turns as ids, with the user's text always read as characters.

    The reference formats `<|im_start|>assistant\\n{text}<|im_end|>\\n...` and tokenizes the whole
    string, so text that spells a control token becomes one: it could end the text early or open a
    new turn. Here the template's control ids are placed by position and only the stretches between
    them go through `encode_text`, which knows no added tokens. The reference's tokenizer cuts at the
    control tokens first and encodes the same stretches one by one, so for text that spells no
    added token the ids are the reference's.
    """

    encode_text: Callable[[str], list[int]]
    im_start_id: int
    im_end_id: int

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerFast) -> ChatTemplate:
        # The ids the reference's tokenization of the template gives, which need not be the config's.
        added = tokenizer.get_added_vocab()
        im_start, im_end = SPECIAL_TOKEN_NAMES["im_start"], SPECIAL_TOKEN_NAMES["im_end"]
        absent = [content for content in (im_start, im_end) if content not in added]
        if absent:
            raise TextTokenizerError(f"the text tokenizer has no added token {absent[0]}")
        return cls(literal_text_encoder(tokenizer), added[im_start], added[im_end])

    def assistant_turn(self, text: str) -> list[int]:
        """`<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`"""
        return [*self._turn("assistant", text), *self.assistant_role()]

    def reference_turn(self, reference_text: str) -> list[int]:
        """`<|im_start|>assistant\\n{reference_text}<|im_end|>\\n`"""
        return self._turn("assistant", reference_text)

    def instruction_turn(self, instruction: str) -> list[int]:
        """`<|im_start|>user\\n{instruction}<|im_end|>\\n`"""
        return self._turn("user", instruction)

    def assistant_role(self) -> list[int]:
        """`<|im_start|>assistant\\n`"""
        return [self.im_start_id, *self.encode_text("assistant\n")]

    def _turn(self, role: str, text: str) -> list[int]:
        # The role line and the text are one stretch, as in the reference: newlines that start the
        # text merge with the role line's into one token.
        return [self.im_start_id, *self.encode_text(f"{role}\n{text}"), self.im_end_id, *self.encode_text("\n")]
