"""nsqd.dat: Go's exact JSON, atomic writes, and LoadMetadata's rules."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from nsqtw.backend.metadata import (
    ChannelMetadata, Metadata, MetadataError, TopicMetadata, decode_metadata, encode_metadata,
    iter_queue_names, load_metadata, metadata_from_broker, write_metadata,
)


def test_encode_matches_go_byte_for_byte(fixtures_dir):
    """Encoding the decoded fixture reproduces the file Go wrote."""
    raw = (fixtures_dir / "go-nsqd-1.3.0-datadir" / "data" / "nsqd.dat").read_bytes()
    assert encode_metadata(decode_metadata(raw)) == raw


def test_encode_nil_slices_as_null():
    """No topics and a topic without channels encode as null, as Go's nil slices."""
    assert encode_metadata(Metadata()) == b'{"topics":null,"version":"1.3.0"}'
    md = Metadata((TopicMetadata("t1", False, (ChannelMetadata("c1", True),)), TopicMetadata("t2")))
    assert encode_metadata(md) == (
        b'{"topics":[{"name":"t1","paused":false,"channels":[{"name":"c1","paused":true}]},'
        b'{"name":"t2","paused":false,"channels":null}],"version":"1.3.0"}')


def test_from_broker_excludes_ephemeral():
    """Ephemeral topics and ephemeral channels of durable topics are not persisted."""
    ch = lambda n, p=False: SimpleNamespace(name=n, paused=p)  # noqa: E731
    broker = SimpleNamespace(topics={
        "a": SimpleNamespace(name="a", paused=True, channels={"x": ch("x"), "y#ephemeral": ch("y#ephemeral")}),
        "b#ephemeral": SimpleNamespace(name="b#ephemeral", paused=False, channels={"z": ch("z")}),
        "c": SimpleNamespace(name="c", paused=False, channels={"e#ephemeral": ch("e#ephemeral")}),
    })
    md = metadata_from_broker(broker)
    assert md.topics == (TopicMetadata("a", True, (ChannelMetadata("x", False),)), TopicMetadata("c", False, ()))
    assert b'"name":"c","paused":false,"channels":null' in encode_metadata(md)
    assert list(iter_queue_names(md)) == ["a", "a:x", "c"]


def test_write_is_atomic_and_round_trips(tmp_path):
    """write_metadata leaves only nsqd.dat (no tmp) and load_metadata reads it back."""
    md = Metadata((TopicMetadata("t", True, (ChannelMetadata("c"),)),))
    write_metadata(str(tmp_path), md)
    write_metadata(str(tmp_path), md)
    assert os.listdir(tmp_path) == ["nsqd.dat"]
    assert load_metadata(str(tmp_path)) == md


def test_missing_file_is_a_fresh_start(tmp_path):
    """No nsqd.dat: None (fresh start), not an error."""
    assert load_metadata(str(tmp_path)) is None


def test_invalid_json_is_fatal_with_a_clear_message(tmp_path):
    """Unparsable JSON raises MetadataError naming the file, as nsqd refuses to start."""
    (tmp_path / "nsqd.dat").write_bytes(b'{"topics":[')
    with pytest.raises(MetadataError, match=r"failed to parse metadata in .*nsqd\.dat"):
        load_metadata(str(tmp_path))


def test_wrong_types_are_fatal():
    """A value of the wrong type is an unmarshal error in Go, so it is fatal here too."""
    with pytest.raises(MetadataError):
        decode_metadata(b'{"topics":[{"name":"t","paused":"yes"}]}')
    with pytest.raises(MetadataError):
        decode_metadata(b'[1,2]')


def test_invalid_names_are_skipped_with_a_warning():
    """Invalid topic and channel names are skipped and reported; the rest loads."""
    warnings = []
    md = decode_metadata(
        b'{"topics":[{"name":"bad topic!","paused":false,"channels":null},'
        b'{"name":"ok","paused":false,"channels":[{"name":"","paused":false},{"name":"c","paused":true}]}],'
        b'"version":"1.3.0"}', warn=warnings.append)
    assert md.topics == (TopicMetadata("ok", False, (ChannelMetadata("c", True),)),)
    assert warnings == ["skipping creation of invalid topic bad topic!", "skipping creation of invalid channel "]


def test_go_decoder_leniency():
    """Keys match case-insensitively, unknown keys and null lists are accepted (as Go's decoder)."""
    md = decode_metadata(b'{"Topics":[{"Name":"t","Paused":true,"Channels":null,"extra":1}],"Version":"1.2.1"}')
    assert md == Metadata((TopicMetadata("t", True, ()),), "1.2.1")
    assert decode_metadata(b"null") == Metadata()
