"""``GraphSpec``: one validated description of an exported graph, used as the export's cache key, written into the
ONNX metadata, read back by ``inspect_graph`` and reported by ``OrtBackend`` (real exports, real sessions)."""

from __future__ import annotations

import dataclasses
import typing

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from accel.backends import ExportWeights, GraphSpec, OrtBackend, TorchBackend, export_cached, export_onnx
from accel.backends.graph_spec import ELEMENTS, GRAPH_SPEC_KEY, Element, GraphOptions
from accel.backends.onnx_graph import build_decoder_graph
from accel.backends.ort_graph import inspect_graph
from accel.backends.stages import StageSpec
from accel.backends.weights import WEIGHT_MODES
from accel.errors import BackendError
from accel.formats.elements import FORMATS
from accel.models import save_pretrained
from tests.helpers.decoders import random_model

CTX = 16

#: every legacy weight name -> (element, runtime, activations): the table of accel.backends.graph_spec
LEGACY = {
    "fp32": ("fp32", "float", "float32"),
    "fp16": ("fp16", "float", "float32"),
    "mx-rounded": ("mxfp6", "rounded", "float32"),
    "mx-packed": ("mxfp6", "packed", "float32"),
    "int8": ("int8", "dynamic", "int8"),
    "mxint8-nbits": ("mxint8", "nbits", "int8"),
    "mxfp6-nbits": ("mxfp6", "nbits", "int8"),
    "mxfp4-nbits": ("mxfp4", "nbits", "int8"),
    "mxint8-kernel": ("mxint8", "kernel", "float32"),
    "mxfp6-kernel": ("mxfp6", "kernel", "float32"),
    "mxfp4-kernel": ("mxfp4", "kernel", "float32"),
    "mxfp6-kernel-q8": ("mxfp6", "kernel", "int8"),
    "mxfp4-kernel-q8": ("mxfp4", "kernel", "int8"),
    "gguf-kernel": ("gguf", "kernel", "float32"),
    "gguf-kernel-q8": ("gguf", "kernel", "int8"),
}

#: specs exported and read back (kernel runtimes need the compiled custom operator: their metadata is checked alone)
ROUND_TRIP = [
    GraphSpec(ctx_len=CTX),
    GraphSpec(ctx_len=CTX, batch_size=2, num_logits=3, element="mxfp4", runtime="packed", float_storage="fp16"),
    GraphSpec(ctx_len=CTX, element="mxint8", runtime="nbits", activations="float32", hidden_output=True, tree=True),
    GraphSpec(ctx_len=CTX, element="int8", int8_scheme="u8s7", mix_inputs=True, ort_ops=False),
    GraphSpec(ctx_len=CTX, element="mxfp6", runtime="rounded", stage=StageSpec(0, 1, 2, exit_logits=True)),
    GraphSpec(ctx_len=CTX, element="fp16", stage=StageSpec(1, 2, 2), ort_ops=True),
]


def _meta(path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


@pytest.mark.parametrize("spec", ROUND_TRIP, ids=lambda s: f"{s.element}-{s.runtime}")
def test_spec_round_trips_through_the_onnx_metadata(spec, tmp_path):
    path = export_onnx(random_model(0), tmp_path / "m.onnx", spec, progress=False)
    meta = _meta(path)
    assert GraphSpec.from_json(meta[GRAPH_SPEC_KEY]) == spec
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert inspect_graph(session, "m").graph_spec == spec
    backend = OrtBackend(path)
    assert backend.graph_spec == spec
    # the older keys stay, derived from the same spec
    assert meta["accel.weights"] == spec.weight_format.value and meta["accel.ctx_len"] == str(CTX)
    assert meta["accel.tree"] == str(int(spec.tree)) and meta["accel.ort_ops"] == str(int(bool(spec.ort_ops)))
    assert backend.info.batch_size == spec.batch_size and ("tree" in backend.info.capabilities) == (
        spec.tree and spec.activations == "float32"
    )


@pytest.mark.parametrize("name", ["mxint8-kernel", "mxfp6-kernel-q8"])
def test_kernel_specs_round_trip_through_their_metadata(name):
    spec = GraphSpec.from_options(ctx_len=CTX, weights=name, tree=True)
    assert GraphSpec.from_metadata(spec.metadata()) == spec
    assert spec.metadata()["accel.weights"] == name


def test_a_feature_draft_records_its_hidden_output(tmp_path):
    from tests.helpers.decoders import oracle_feature_draft

    draft = oracle_feature_draft(random_model(0), [1, 2, 3])
    path = export_onnx(draft, tmp_path / "d.onnx", ctx_len=CTX, progress=False)
    assert OrtBackend(path).graph_spec == GraphSpec(ctx_len=CTX, hidden_output=True)


def test_a_spec_that_disagrees_with_its_graph_is_refused(tmp_path):
    path = export_onnx(random_model(0), tmp_path / "m.onnx", ctx_len=CTX, progress=False)
    proto = onnx.load(str(path))
    for prop in proto.metadata_props:
        if prop.key == GRAPH_SPEC_KEY:
            prop.value = GraphSpec(ctx_len=CTX, tree=True).to_json()
    onnx.save(proto, str(tmp_path / "lying.onnx"))
    with pytest.raises(
        BackendError, match=r"accel\.graph_spec disagrees with the graph: tree True \(the graph: False\)"
    ):
        OrtBackend(tmp_path / "lying.onnx")
    kept = [p for p in proto.metadata_props if p.key != GRAPH_SPEC_KEY]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    onnx.save(proto, str(tmp_path / "older.onnx"))
    assert OrtBackend(tmp_path / "older.onnx").graph_spec is None  # a graph without a spec still opens


@pytest.mark.parametrize("name", WEIGHT_MODES)
def test_every_legacy_weight_name_maps_to_element_and_runtime_and_back(name):
    spec = GraphSpec.from_options(ctx_len=CTX, weights=name)
    assert (spec.element, spec.runtime, spec.activations) == LEGACY[name]
    assert spec.weight_format.value == name
    assert spec.export_weights == ExportWeights.of(name)
    element, runtime, activations = LEGACY[name]
    assert GraphSpec(ctx_len=CTX, element=element, runtime=runtime, activations=activations) == spec


def test_the_legacy_table_covers_every_weight_name():
    assert sorted(LEGACY) == sorted(WEIGHT_MODES)


@pytest.mark.parametrize(
    "weights",
    [
        ExportWeights("mxint8-nbits", accuracy_level=1),
        ExportWeights("mx-rounded", mx_format="mxfp4", float_storage="fp16"),
        ExportWeights("mx-packed", mx_format="mxfp6_e3m2"),
        ExportWeights("mx-packed", mx_format="mxfp8_e5m2"),
        ExportWeights("int8", int8_scheme="u8s8"),
    ],
)
def test_export_weights_options_map_and_back(weights):
    spec = GraphSpec.from_options(ctx_len=CTX, weights=weights)
    assert spec.export_weights == weights


def test_element_names_are_stored_short_and_cover_every_mx_format():
    assert set(typing.get_args(Element)) == set(ELEMENTS)
    for full in FORMATS:
        spec = GraphSpec(ctx_len=CTX, element=full, runtime="packed")
        assert spec.element in ELEMENTS and GraphSpec(ctx_len=CTX, element=spec.element, runtime="packed") == spec
    assert GraphSpec(ctx_len=CTX, element="mxfp6_e2m3", runtime="packed").element == "mxfp6"


@pytest.mark.parametrize("weights", ["fp16", "mx-packed", "mxint8-nbits"])
def test_the_new_fields_build_the_legacy_graph_byte_for_byte(weights, tmp_path):
    model = random_model(1)
    old = export_onnx(model, tmp_path / "old.onnx", ctx_len=CTX, weights=weights, progress=False)
    element, runtime, activations = LEGACY[weights]
    spec = GraphSpec(ctx_len=CTX, element=element, runtime=runtime, activations=activations)
    new = export_onnx(model, tmp_path / "new.onnx", spec, progress=False)
    assert old.read_bytes().replace(b"old.onnx", b"") == new.read_bytes().replace(b"new.onnx", b"")


def test_the_builders_older_keywords_build_the_same_graph():
    model = random_model(2)
    tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    old = build_decoder_graph(model.config, tensors, ctx_len=CTX, batch_size=2, tree=True, fused=True)
    new = build_decoder_graph(model.config, tensors, GraphSpec(ctx_len=CTX, batch_size=2, tree=True, ort_ops=True))
    assert old.SerializeToString() == new.SerializeToString()
    with pytest.raises(BackendError, match="not both"):
        build_decoder_graph(model.config, tensors, GraphSpec(ctx_len=CTX), tree=True)


# ---------------------------------------------------------------------- the cache key

BASE = GraphSpec(ctx_len=CTX)
MX = {"element": "mxfp6", "runtime": "packed"}
NBITS = {"element": "mxfp6", "runtime": "nbits"}
#: for every field, two specs (as fields beside ctx_len) that differ in that field only (``opset`` has one value)
DIFFS = {
    "ctx_len": ({}, {"ctx_len": 32}),
    "batch_size": ({}, {"batch_size": 2}),
    "num_logits": ({}, {"num_logits": 1}),
    "element": (MX, {**MX, "element": "mxfp4"}),
    "runtime": (MX, {**MX, "runtime": "rounded"}),
    "activations": (NBITS, {**NBITS, "activations": "float32"}),
    "float_storage": (MX, {**MX, "float_storage": "fp16"}),
    "int8_scheme": ({"element": "int8"}, {"element": "int8", "int8_scheme": "u8s7"}),
    "hidden_output": ({}, {"hidden_output": True}),
    "tree": ({}, {"tree": True}),
    "mix_inputs": ({}, {"mix_inputs": True}),
    "logits_input": ({}, {"logits_input": True}),
    "stage": ({}, {"stage": StageSpec(0, 1, 2)}),
    "ort_ops": ({}, {"ort_ops": True}),
    "accel_attention": ({"ort_ops": True}, {"ort_ops": True, "accel_attention": True}),
}


def test_every_field_is_covered_by_the_cache_key_tests():
    fields = {f.name for f in dataclasses.fields(GraphSpec)}
    assert set(DIFFS) | {"opset"} == fields == set(GraphOptions.__annotations__) - {"weights"}


@pytest.mark.parametrize("field", DIFFS)
def test_the_cache_key_changes_with_every_field(field):
    before, after = (GraphSpec(**{"ctx_len": CTX, **fields}) for fields in DIFFS[field])
    a, b = before.to_dict(), after.to_dict()  # logits_input is in the dict only where set
    assert [name for name in {**a, **b} if a.get(name, False) != b.get(name, False)] == [field]
    assert after.cache_key() != before.cache_key()


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (GraphSpec.from_options(ctx_len=CTX, weights="mxfp6-nbits"), GraphSpec(CTX, element="mxfp6", runtime="nbits")),
        (
            GraphSpec.from_options(ctx_len=CTX, weights="mxfp6-kernel-q8"),
            GraphSpec(CTX, element="mxfp6_e2m3", runtime="kernel", activations="int8"),
        ),
        (
            GraphSpec.from_options(ctx_len=CTX, weights=ExportWeights("mx-packed", mx_format="mxfp4_e2m1")),
            GraphSpec(CTX, element="mxfp4", runtime="packed"),
        ),
        (GraphSpec.from_options(ctx_len=CTX, weights="int8"), GraphSpec(CTX, element="int8", ort_ops=True)),
        (BASE, GraphSpec(CTX, 1, None, "fp32", "float", "float32", ort_ops=False, opset=18)),
        (GraphSpec.from_options(ctx_len=CTX, weights=ExportWeights("fp32", mx_format="mxfp4")), BASE),
    ],
)
def test_the_cache_key_stays_for_the_same_graph(one, other):
    assert one == other and one.to_json() == other.to_json() and one.cache_key() == other.cache_key()


def test_the_cache_key_changes_with_the_files(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    key = BASE.cache_key([f])
    assert BASE.cache_key([f]) == key and BASE.cache_key() != key
    f.write_bytes(b"xy")
    assert BASE.cache_key([f]) != key


def test_export_cached_takes_a_spec_and_keys_on_it(tmp_path):
    src = save_pretrained(random_model(3), tmp_path / "ckpt")
    first = export_cached(src, tmp_path / "onnx", GraphSpec(ctx_len=CTX))
    assert export_cached(src, tmp_path / "onnx", ctx_len=CTX, weights="fp32") == first
    other = export_cached(src, tmp_path / "onnx", GraphSpec(ctx_len=CTX, tree=True))
    assert other != first and OrtBackend(other).graph_spec == GraphSpec(ctx_len=CTX, tree=True)


# ---------------------------------------------------------------------- refusals


def test_unknown_keywords_are_refused_by_name(tmp_path):
    model = random_model(0)
    with pytest.raises(
        BackendError, match=r"export_onnx got unknown keyword\(s\) hiden_output; graph settings: ctx_len"
    ):
        export_onnx(model, tmp_path / "m.onnx", ctx_len=CTX, hiden_output=True, progress=False)
    with pytest.raises(BackendError, match=r"export_cached got unknown keyword\(s\) trees"):
        export_cached(tmp_path, tmp_path / "onnx", ctx_len=CTX, trees=True)
    with pytest.raises(BackendError, match="not both"):
        export_onnx(model, tmp_path / "m.onnx", GraphSpec(ctx_len=CTX), ctx_len=CTX, progress=False)
    with pytest.raises(BackendError, match="needs ctx_len"):
        export_onnx(model, tmp_path / "m.onnx", progress=False)
    with pytest.raises(BackendError, match=r"weights= sets element too"):
        export_onnx(model, tmp_path / "m.onnx", ctx_len=CTX, weights="fp16", element="fp16", progress=False)
    assert list(tmp_path.iterdir()) == []
    path = export_onnx(model, tmp_path / "m.onnx", ctx_len=CTX, progress=False)
    with pytest.raises(BackendError, match=r"OrtBackend got unknown keyword\(s\) thread; session settings: threads"):
        OrtBackend(path, thread=2)
    with pytest.raises(BackendError, match=r"TorchBackend got unknown keyword\(s\) devices; runtime settings"):
        TorchBackend(model, ctx_len=CTX, devices="cpu")


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"element": "fp8"}, "element 'fp8' is not supported; supported: fp32, fp16, int8, gguf, mx"),
        ({"element": "mxfp6"}, "element mxfp6 needs a runtime: rounded, packed"),
        ({"element": "fp32", "runtime": "packed"}, "runtime packed runs the elements mxfp4, .*; not fp32"),
        ({"element": "mxfp8", "runtime": "nbits"}, "runtime nbits runs the elements mxint8, mxfp6, mxfp4; not mxfp8"),
        ({"element": "int8", "runtime": "float"}, "runtime float runs the elements fp32, fp16; not int8"),
        ({"element": "mxfp6", "runtime": "gpu"}, "runtime 'gpu' is not supported; supported: float, dynamic"),
        ({"element": "mxint8", "runtime": "kernel", "activations": "int8"}, "int8 activations runs mxfp6, mxfp4"),
        ({"activations": "int8"}, "runtime float takes activations float32; not 'int8'"),
        ({"element": "gguf", "runtime": "nbits"}, "runtime nbits runs the elements mxint8, mxfp6, mxfp4; not gguf"),
        ({"element": "mxfp6", "runtime": "packed", "activations": "bf16"}, "takes activations float32; not 'bf16'"),
        ({"element": "mxfp6", "runtime": "nbits", "float_storage": "fp16"}, "float_storage applies to runtimes"),
        ({"element": "mxfp6", "runtime": "packed", "float_storage": "bf16"}, "float_storage='bf16' is not supported"),
        ({"int8_scheme": "u8s7"}, "int8_scheme applies to element int8"),
        ({"element": "int8", "int8_scheme": "s8s8"}, "int8_scheme='s8s8' is not supported"),
        ({"tree": True, "stage": StageSpec(0, 1, 2)}, "tree inputs are for whole-model graphs"),
        ({"stage": (0, 1, 2)}, "stage must be a StageSpec or None"),
        ({"hidden_output": "yes"}, "hidden_output must be True or False; got 'yes'"),
        ({"ort_ops": 1}, "ort_ops must be True or False; got 1"),
        (
            {"accel_attention": True, "ort_ops": False},
            "accel_attention .* it needs ort_ops",
        ),
        ({"accel_attention": 1, "ort_ops": True}, "accel_attention must be True or False; got 1"),
        ({"opset": 13}, "opset 13 is not supported; supported: 18"),
        ({"ctx_len": 0}, "ctx_len must be an int >= 1; got 0"),
        ({"num_logits": 17}, r"num_logits=17 must be in 1\.\.ctx_len \(16\)"),
        ({"batch_size": 2.0}, "batch_size must be an int"),
    ],
)
def test_invalid_combinations_are_refused_by_name(fields, needle):
    with pytest.raises(BackendError, match=needle):
        GraphSpec(**{"ctx_len": CTX, **fields})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{", "is not JSON"),
        ("[]", "must be a JSON object"),
        ('{"ctx_len": 16, "colour": "red"}', r"unknown fields \['colour'\]"),
        ('{"batch_size": 1}', "lacks ctx_len"),
        ('{"ctx_len": 16, "stage": {"start": 0}}', "stage must be start, stop, total, exit_logits"),
        ('{"ctx_len": 16, "element": "mxfp6"}', "needs a runtime"),
    ],
)
def test_a_bad_recorded_spec_is_refused(text, needle):
    with pytest.raises(BackendError, match=needle):
        GraphSpec.from_json(text, "m.onnx")


def test_exported_logits_follow_the_spec_not_its_spelling(tmp_path):
    """A spec and the keywords that make it export graphs that compute the same logits (float32, bit for bit)."""
    model = random_model(4)
    a = export_onnx(model, tmp_path / "a.onnx", GraphSpec(ctx_len=CTX, batch_size=2, tree=True), progress=False)
    b = export_onnx(model, tmp_path / "b.onnx", ctx_len=CTX, batch_size=2, tree=True, progress=False)
    ids = np.tile(np.arange(5), (2, 1))
    np.testing.assert_array_equal(OrtBackend(a).forward(ids, ids), OrtBackend(b).forward(ids, ids))


def test_accel_attention_turns_ort_ops_on_unless_told_not_to():
    assert GraphSpec(ctx_len=CTX, accel_attention=True).ort_ops is True
    assert GraphSpec(ctx_len=CTX, accel_attention=True, element="int8").ort_ops is True
    assert GraphSpec(ctx_len=CTX).ort_ops is False  # fp32 alone: standard ONNX (what Cloud AI 100 reads)
    with pytest.raises(BackendError, match="it needs ort_ops"):
        GraphSpec(ctx_len=CTX, accel_attention=True, ort_ops=False)
