from __future__ import annotations

import contextlib
import dataclasses
import re
import textwrap
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import clusterspec, names
from common.errors import ClusterSpecError
from tests.conftest import REPO, shared_path

GIB = 1024**3
MIB = 1024**2
S = 1_000_000_000
DEMO = REPO / "examples" / "clusters" / "demo.yaml"


def spec(text: str) -> clusterspec.ClusterSpec:
    return clusterspec.loads(textwrap.dedent(text), source="cluster.yaml")


def error(text: str) -> str:
    with pytest.raises(ClusterSpecError) as caught:
        spec(text)
    return str(caught.value)


# --- The demo cluster ---


def test_the_demo_cluster_has_gpu_nodes_of_two_models_a_cpu_node_scripted_pods_and_an_unowned_process() -> None:
    demo = clusterspec.load(DEMO)
    by_name = {node.name: node for node in demo.nodes}
    assert list(by_name) == ["a100-0", "a100-1", "l4-0", "cpu-0"]
    assert {node.gpus[0].model for node in demo.nodes if node.gpus} == {"A100-80GB", "L4"}
    assert by_name["cpu-0"].gpus == ()
    assert [(p.gpu_index, p.memory.at(20 * S)) for p in by_name["a100-1"].unowned_processes] == [(3, 6 * GIB)]
    # The merge key gave a100-1 everything a100-0 has, under its own name.
    assert by_name["a100-1"].milli_cpu == by_name["a100-0"].milli_cpu == 96_000
    assert by_name["a100-1"].labels["topology.kubernetes.io/zone"] == "zone-a"
    scripted = [pod for pod in demo.pods if pod.gpu_memory is not None]
    assert len(scripted) >= 3
    grows_and_shrinks = [
        pod
        for pod in scripted
        if pod.gpu_memory is not None and pod.gpu_memory.points[-1][1] < pod.gpu_memory.peak_bytes
    ]
    assert grows_and_shrinks, "some pod's memory should fall after its peak"
    assert {pod.queue for pod in demo.pods} == {"team-a", "team-b"}


# --- Nodes ---


def test_a_node_entry_with_count_becomes_numbered_nodes() -> None:
    cluster = spec(
        """
        nodes:
          - {name: gpu, count: 3, gpus: {count: 2, model: T4}}
          - {name: solo}
        """
    )
    assert [node.name for node in cluster.nodes] == ["gpu-0", "gpu-1", "gpu-2", "solo"]


def test_nodes_without_a_name_are_numbered_on_across_entries() -> None:
    cluster = spec(
        """
        nodes:
          - {count: 2}
          - {cpu: 8}
        """
    )
    assert [node.name for node in cluster.nodes] == ["node-0", "node-1", "node-2"]


@pytest.mark.parametrize(
    ("gpus", "cores", "memory_gib"),
    [(0, 64, 512), (1, 64, 512), (4, 64, 512), (8, 128, 1024), (16, 256, 2048)],
)
def test_node_cpu_and_memory_default_by_gpu_count_in_both_forms(gpus: int, cores: int, memory_gib: int) -> None:
    model = "xH100-80GB" if gpus else ""
    inline = clusterspec.parse_inline(f"1x{gpus}{model}").nodes[0]
    gpus_yaml = f"gpus: {{count: {gpus}, model: H100-80GB}}" if gpus else "pods: 110"
    written = spec(f"nodes:\n  - name: n\n    {gpus_yaml}\n").nodes[0]
    for node in (inline, written):
        assert (node.milli_cpu, node.memory_bytes, node.pods) == (cores * 1000, memory_gib * GIB, 110)


@pytest.mark.parametrize(("cpu", "milli_cpu"), [("96", 96_000), ("0.5", 500), ("1500m", 1500), ('"4"', 4000)])
def test_node_cpu_takes_cores_or_a_cpu_quantity(cpu: str, milli_cpu: int) -> None:
    assert spec(f"nodes: [{{name: n, cpu: {cpu}}}]").nodes[0].milli_cpu == milli_cpu


@pytest.mark.parametrize(
    ("memory", "memory_bytes"), [("1Ti", 1024 * GIB), ("1073741824", GIB), ("1.5Gi", 3 * GIB // 2), ("4G", 4 * 10**9)]
)
def test_node_memory_takes_a_quantity_or_bytes(memory: str, memory_bytes: int) -> None:
    assert spec(f"nodes: [{{name: n, memory: {memory}, pods: 20}}]").nodes[0].memory_bytes == memory_bytes


def test_gpu_memory_comes_from_the_model_table_and_can_be_overridden() -> None:
    cluster = spec(
        """
        nodes:
          - {name: h200, gpus: {count: 1, model: H200}}
          - {name: h100, gpus: {count: 1, model: H100-80GB, memory: 80Gi}}
        """
    )
    h200, h100 = cluster.nodes
    assert h200.gpus[0].memory_bytes == 143771 * MIB
    assert h200.labels["nvidia.com/gpu.memory"] == "143771"
    assert (h100.gpus[0].product, h100.gpus[0].memory_bytes) == ("NVIDIA H100 80GB HBM3", 80 * GIB)
    assert h100.labels["nvidia.com/gpu.memory"] == "81920"


def test_an_unknown_gpu_model_is_accepted_with_its_memory() -> None:
    node = spec("nodes: [{name: n, gpus: {count: 2, model: MI300X, memory: 192Gi}}]").nodes[0]
    assert [(gpu.index, gpu.model, gpu.memory_bytes) for gpu in node.gpus] == [
        (0, "MI300X", 192 * GIB),
        (1, "MI300X", 192 * GIB),
    ]
    assert node.labels["nvidia.com/gpu.product"] == "MI300X"


@pytest.mark.parametrize("written", ["V100-16GB", "v100-16gb", "Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB"])
def test_known_models_are_found_by_spec_name_nvml_name_or_label_in_any_case(written: str) -> None:
    model = clusterspec.lookup_gpu_model(written)
    assert model is not None
    assert (model.name, model.memory_bytes, model.product_label) == ("V100-16GB", 16160 * MIB, "Tesla-V100-SXM2-16GB")


@pytest.mark.parametrize("trace_model", ["P100", "T4", "V100M16", "V100M32", "G1", "G2", "G3", "A10"])
def test_every_gpu_model_of_the_alibaba_trace_is_known(trace_model: str) -> None:
    model = clusterspec.lookup_gpu_model(trace_model)
    assert model is not None and model.name == trace_model and model.memory_bytes > 0


def test_the_trace_node_file_uses_only_known_gpu_models() -> None:
    rows = shared_path("data", "openb", "openb_node_list_gpu_node.csv").read_text().splitlines()[1:]
    models = {row.split(",")[4] for row in rows if row}
    assert models and all(clusterspec.lookup_gpu_model(model) is not None for model in models)


def test_gpu_nodes_get_the_labels_of_gpu_feature_discovery_and_the_kubelet() -> None:
    node = spec("nodes: [{name: a-0, gpus: {count: 8, model: A100-80GB}}]").nodes[0]
    assert dict(node.labels) == {
        "kubernetes.io/hostname": "a-0",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.count": "8",
    }


def test_labels_written_in_the_spec_are_kept_as_written_and_win_over_standard_ones() -> None:
    node = spec(
        """
        nodes:
          - name: n
            labels: {example.com/flag: true, example.com/ratio: 0.50, nvidia.com/gpu.product: Tesla-T4}
            gpus: {count: 1, model: L4}
        """
    ).nodes[0]
    assert node.labels["example.com/flag"] == "true"
    assert node.labels["example.com/ratio"] == "0.50"
    assert node.labels["nvidia.com/gpu.product"] == "Tesla-T4"


def test_taints_are_read_from_mappings_and_from_kubectl_form() -> None:
    node = spec(
        """
        nodes:
          - name: n
            taints:
              - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
              - dedicated=research:NoExecute
              - maintenance:PreferNoSchedule
        """
    ).nodes[0]
    assert [(t.key, t.value, t.effect) for t in node.taints] == [
        ("nvidia.com/gpu", "present", clusterspec.TaintEffect.NO_SCHEDULE),
        ("dedicated", "research", clusterspec.TaintEffect.NO_EXECUTE),
        ("maintenance", "", clusterspec.TaintEffect.PREFER_NO_SCHEDULE),
    ]


def test_unowned_processes_hold_a_constant_or_scripted_amount() -> None:
    node = spec(
        """
        nodes:
          - name: n
            gpus: {count: 2, model: T4}
            unowned_processes:
              - {gpu: 0, memory: 6Gi}
              - {gpu: 1, memory: "1Gi@5s,4Gi@30s"}
              - {gpu: 1, memory: [{at: 1m, memory: 512Mi}]}
        """
    ).nodes[0]
    constant, scripted, listed = node.unowned_processes
    assert (constant.gpu_index, constant.memory) == (0, clusterspec.MemoryScript.constant(6 * GIB))
    assert [scripted.memory.at(t * S) for t in (0, 5, 29, 30)] == [None, GIB, GIB, 4 * GIB]
    assert listed.memory.points == ((60 * S, 512 * MIB),)


def test_node_capacity_counts_whole_devices_in_milli_gpu() -> None:
    capacity = clusterspec.parse_inline("1x4xT4:cpu=8,mem=64Gi,pods=30").nodes[0].capacity
    assert (capacity.milli_cpu, capacity.memory_bytes, capacity.milli_gpu, capacity.pods) == (8000, 64 * GIB, 4000, 30)


def test_make_node_builds_the_same_node_as_the_spec_forms() -> None:
    made = clusterspec.make_node("node-0", gpu_count=2, gpu_model="P100")
    assert made == clusterspec.parse_inline("1x2xP100").nodes[0]
    with pytest.raises(ClusterSpecError, match=r"node 'n': unknown GPU model 'X'"):
        clusterspec.make_node("n", gpu_count=1, gpu_model="X")


def test_spec_values_cannot_be_changed() -> None:
    node = clusterspec.parse_inline("1x1xT4").nodes[0]
    with pytest.raises(TypeError):
        node.labels["kubernetes.io/hostname"] = "other"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.name = "other"  # type: ignore[misc]


# --- Pods ---


def test_a_pod_gets_the_documented_defaults() -> None:
    pod = spec("nodes: [{name: n}]\npods: [{name: p}]").pods[0]
    assert (pod.namespace, pod.scheduler_name, pod.queue, pod.node) == ("default", "quotient", None, None)
    assert (pod.milli_cpu, pod.memory_bytes, pod.gpus, pod.arrive_ns, pod.duration_ns) == (0, 0, 0, 0, None)
    assert (dict(pod.labels), dict(pod.annotations), dict(pod.node_selector), pod.tolerations) == ({}, {}, {}, ())
    assert pod.gpu_memory is None


def test_every_pod_field_is_read() -> None:
    pod = spec(
        """
        nodes: [{name: a100-0, gpus: {count: 4, model: A100-80GB}}]
        pods:
          - name: train
            namespace: team-a
            queue: research
            scheduler_name: kai-scheduler
            requests: {cpu: 8, memory: 64Gi, nvidia.com/gpu: 2}
            labels: {app: train}
            annotations: {example.com/owner: alice}
            node_selector: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}
            tolerations:
              - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
              - {key: dedicated, value: research}
              - {operator: Exists}
            node: a100-0
            gpu_memory: "2Gi@0s,30Gi@20s"
            arrive: 1m30s
            duration: 10m
        """
    ).pods[0]
    assert (pod.name, pod.namespace, pod.scheduler_name, pod.queue, pod.node) == (
        "train",
        "team-a",
        "kai-scheduler",
        "research",
        "a100-0",
    )
    assert (pod.milli_cpu, pod.memory_bytes, pod.gpus) == (8000, 64 * GIB, 2)
    assert dict(pod.labels) == {"app": "train", "kai.scheduler/queue": "research"}
    assert dict(pod.annotations) == {
        "example.com/owner": "alice",
        names.SIM_GPU_MEMORY_ANNOTATION: "2Gi@0s,30Gi@20s",
    }
    assert dict(pod.node_selector) == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert [(t.key, t.operator, t.value, t.effect) for t in pod.tolerations] == [
        ("nvidia.com/gpu", clusterspec.TolerationOperator.EXISTS, "", clusterspec.TaintEffect.NO_SCHEDULE),
        ("dedicated", clusterspec.TolerationOperator.EQUAL, "research", None),
        ("", clusterspec.TolerationOperator.EXISTS, "", None),
    ]
    assert (pod.arrive_ns, pod.duration_ns) == (90 * S, 600 * S)


def test_a_pod_entry_with_count_becomes_numbered_pods_per_namespace() -> None:
    cluster = spec(
        """
        nodes: [{name: n}]
        pods:
          - {name: worker, count: 2}
          - {name: worker, namespace: other, count: 2}
          - {name: worker, count: 1}
        """
    )
    assert [(pod.namespace, pod.name) for pod in cluster.pods] == [
        ("default", "worker-0"),
        ("default", "worker-1"),
        ("other", "worker-0"),
        ("other", "worker-1"),
        ("default", "worker-2"),
    ]


def test_the_written_and_the_listed_memory_script_are_the_same() -> None:
    written, listed = spec(
        """
        nodes: [{name: n}]
        pods:
          - {name: a, annotations: {gpu-fraction: "0.5"}, gpu_memory: "2Gi@0s, 30Gi@20s, 8Gi@1m"}
          - name: b
            annotations: {gpu-fraction: "0.5"}
            gpu_memory: [{at: 0s, memory: 2Gi}, {at: 20s, memory: 30Gi}, {at: 60, memory: 8Gi}]
        """
    ).pods
    assert written.gpu_memory == listed.gpu_memory
    assert written.annotations[names.SIM_GPU_MEMORY_ANNOTATION] == "2Gi@0s,30Gi@20s,8Gi@60s"


def test_a_memory_script_may_be_given_as_the_pod_annotation() -> None:
    pod = spec(
        """
        nodes: [{name: n}]
        pods:
          - name: p
            requests: {nvidia.com/gpu: 1}
            annotations: {quotient.dev/sim-gpu-memory: "1Gi@0s,3Gi@10s"}
        """
    ).pods[0]
    assert pod.gpu_memory == clusterspec.parse_memory_script("1Gi@0s,3Gi@10s")


# --- Errors name the file, the line and the field ---


def test_an_error_names_the_file_line_and_field() -> None:
    message = error(
        """\
        nodes:
          - name: a
            gpus: {count: 1, model: T4}
          - name: b
            cpu: 4
            gpus:
              count: many
              model: T4
        """
    )
    assert message.startswith("cluster.yaml:7: nodes[1].gpus.count: ")
    assert "'many'" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "nodes:\n  - name: a\n    gpu: {count: 1}\n",
            r"^cluster\.yaml:3: nodes\[0\]\.gpu: unknown key \(did you mean 'gpus'\?\)",
        ),
        ("nodes:\n  - name: a\n    cpu: [1]\n", r"^cluster\.yaml:3: nodes\[0\]\.cpu: expected a value, got a list"),
        ("nodes:\n  - name: a\n    cpu: -4\n", r"^cluster\.yaml:3: nodes\[0\]\.cpu: .*negative"),
        (
            "nodes:\n  - name: a\n    memory: 12GB\n",
            r"^cluster\.yaml:3: nodes\[0\]\.memory: '12GB' is not a Kubernetes",
        ),
        (
            "nodes:\n  - name: a\n  - name: a\n",
            r"^cluster\.yaml:3: nodes\[1\]: duplicate node name 'a' \(also on line 2\)",
        ),
        (
            "nodes:\n  - {name: g, count: 2}\n  - {name: g-1}\n",
            r"^cluster\.yaml:3: nodes\[1\]: duplicate node name 'g-1'",
        ),
        (
            "nodes: [{name: n}]\npods:\n  - {name: p}\n  - {name: p}\n",
            r"^cluster\.yaml:4: pods\[1\]: duplicate pod default/p \(also on line 3\)",
        ),
        (
            "nodes: [{name: gpu-0}]\npods:\n  - {name: p, node: gpu-1}\n",
            r"^cluster\.yaml:3: pods\[0\]\.node: unknown node 'gpu-1' \(did you mean 'gpu-0'\?\)",
        ),
        (
            "nodes:\n  - name: n\n    gpus: {count: 2, model: T4}\n    unowned_processes:\n"
            "      - {gpu: 2, memory: 1Gi}\n",
            r"^cluster\.yaml:5: nodes\[0\]\.unowned_processes\[0\]: GPU 2 does not exist; the node has 2",
        ),
        (
            "nodes:\n  - name: n\n    unowned_processes: [{gpu: 0, memory: 1Gi}]\n",
            r"^cluster\.yaml:3: .*GPU 0 does not exist; the node has 0",
        ),
        (
            "nodes:\n  - name: n\n    gpus: {count: 1, model: T4}\n    unowned_processes: [{gpu: 0, memory: 16Gi}]\n",
            r"^cluster\.yaml:4: .*more than the device's 15\.0 GiB",
        ),
        (
            "nodes:\n  - name: n\n    gpus: {count: 1, model: A100-80G}\n",
            r"^cluster\.yaml:3: nodes\[0\]\.gpus\.model: unknown GPU model 'A100-80G' \(did you mean 'A100-80GB'\?\); "
            r"give its memory",
        ),
        (
            "nodes:\n  - name: n\n    gpus: {count: 1}\n",
            r"^cluster\.yaml:3: nodes\[0\]\.gpus: 1 GPUs need a model",
        ),
        (
            "nodes:\n  - name: n\n    taints: [{key: k, effect: NoSchedul}]\n",
            r"^cluster\.yaml:3: nodes\[0\]\.taints\[0\]: taint effect 'NoSchedul' is not one of NoSchedule, "
            r"PreferNoSchedule, NoExecute \(did you mean 'NoSchedule'\?\)",
        ),
        ("nodes:\n  - name: n\n    taints: [k=v]\n", r"^cluster\.yaml:3: .*is not KEY\[=VALUE\]:EFFECT"),
        (
            "nodes:\n  - name: n\n    name: m\n",
            r"^cluster\.yaml:3: nodes\[0\]\.name: duplicate key \(first on line 2\)",
        ),
        ("nodes:\n  - name: yes\n", r"^cluster\.yaml:2: nodes\[0\]\.name: expected a value, got bool 'yes'; quote it"),
        ("nodes:\n  - name: GPU_1\n", r"^cluster\.yaml:2: nodes\[0\]\.name: node name 'GPU_1' is not a valid"),
        ("nodes:\n  - name: n\n    labels: {team: a b}\n", r"^cluster\.yaml:3: nodes\[0\]\.labels\.team: label value"),
        ("nodes:\n  - name: n\n  - {count: 0}\n", r"^cluster\.yaml:3: nodes\[1\]\.count: must be at least 1"),
        ("nodes:\n  - name: n\n   bad: [\n", r"^cluster\.yaml:3: not valid YAML"),
        ("nodes: []\n", r"^cluster\.yaml:1: nodes: a cluster needs at least one node"),
        ("pods: []\n", r"^cluster\.yaml:1: : missing required key 'nodes'"),
        ("# nothing\n", r"^cluster\.yaml: empty cluster spec"),
        ("- a\n", r"^cluster\.yaml:1: : expected a mapping, got a list"),
        (
            "nodes: [{name: n}]\npods:\n  - name: p\n    requests: {nvidia.com/gpu: 0.5}\n",
            r"^cluster\.yaml:4: pods\[0\]\.requests\.nvidia\.com/gpu: .*not a whole number.*gpu-fraction",
        ),
        (
            "nodes: [{name: n}]\npods:\n  - name: p\n    requests: {gpu: 1}\n",
            r"^cluster\.yaml:4: pods\[0\]\.requests\.gpu: unknown key \(did you mean 'nvidia\.com/gpu'\?\); "
            r"accepted: cpu, memory, nvidia\.com/gpu",
        ),
        (
            "nodes: [{name: n}]\npods:\n  - name: p\n    requests: {nvidia.com/gpu: 1}\n"
            "    gpu_memory: 2Gi@10s,3Gi@5s\n",
            r"^cluster\.yaml:5: pods\[0\]\.gpu_memory: offsets must increase, but 5s follows 10s",
        ),
        (
            "nodes: [{name: n}]\npods:\n  - name: p\n    gpu_memory: 2Gi\n",
            r"^cluster\.yaml:3: pods\[0\]: a GPU memory script needs a GPU",
        ),
        (
            "nodes: [{name: n}]\npods:\n  - name: p\n    requests: {nvidia.com/gpu: 1}\n    gpu_memory: 2Gi\n"
            "    annotations: {quotient.dev/sim-gpu-memory: 2Gi}\n",
            r"^cluster\.yaml:5: pods\[0\]\.gpu_memory: also given as the annotation",
        ),
        (
            "nodes: [{name: n}]\npods:\n  - name: p\n    queue: a\n    labels: {kai.scheduler/queue: b}\n",
            r"^cluster\.yaml:4: pods\[0\]\.queue: contradicts the label kai\.scheduler/queue=b",
        ),
        (
            "nodes: [{name: n}]\npods:\n  - name: p\n    tolerations: [{key: k, operator: Exists, value: v}]\n",
            r"^cluster\.yaml:4: pods\[0\]\.tolerations\[0\]: a toleration with operator Exists takes no value",
        ),
        (
            "nodes: [{name: n}]\npods:\n  - name: p\n    arrive: soon\n",
            r"^cluster\.yaml:4: pods\[0\]\.arrive: 'soon' is not a duration",
        ),
        (
            "nodes: [{name: n}]\npods:\n  - {namespace: x}\n",
            r"^cluster\.yaml:3: pods\[0\]: missing required key 'name'",
        ),
    ],
)
def test_invalid_specs_are_refused_with_the_file_line_field_and_reason(text: str, expected: str) -> None:
    assert re.search(expected, error(text)), error(text)


def test_a_file_that_cannot_be_read_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterSpecError, match=r"missing\.yaml: cannot read the cluster spec"):
        clusterspec.load(tmp_path / "missing.yaml")


def test_errors_in_a_loaded_file_name_its_path(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes:\n  - name: a\n    gpus: {count: 1, model: T4, memroy: 1Gi}\n")
    with pytest.raises(ClusterSpecError, match=rf"^{re.escape(str(path))}:3: nodes\[0\]\.gpus\.memroy: unknown key"):
        clusterspec.load(path)


# --- GPU UUIDs ---


def test_gpu_uuids_are_the_same_in_every_run_and_differ_between_devices() -> None:
    first = clusterspec.parse_inline("2x4xL4")
    again = clusterspec.parse_inline("2x4xL4")
    uuids = [gpu.uuid for node in first.nodes for gpu in node.gpus]
    assert uuids == [gpu.uuid for node in again.nodes for gpu in node.gpus]
    assert len(set(uuids)) == 8
    assert all(
        re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", u) for u in uuids
    )
    # Pinned: a change here renames every fake GPU, which breaks recorded traces and dashboards.
    assert clusterspec.gpu_uuid("node-0", 0) == "GPU-41faa2be-3681-57b4-8d9c-45d156c57823"


def test_gpu_uuids_are_name_based_uuid5() -> None:
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, "https://quotient.dev/fake-gpu")
    for node, index in [("node-0", 0), ("a100-1", 3), ("x" * 200, 63)]:
        assert clusterspec.gpu_uuid(node, index) == f"GPU-{uuid.uuid5(namespace, f'{node}/{index}')}"


# --- Properties ---

_YAML_PIECES = st.sampled_from(
    [
        *("nodes:", "pods:", "\n", "  ", "- ", "name: n", "count: 2", "gpus: {count: 1, model: T4}", "&a ", "*a"),
        *("<<: *a", "{", "}", "[", "]", ":", "memory: 1Gi", "cpu: -1", "!!binary x", "!!int z", "yes", "~", "'", '"'),
        *("\t", "#"),
    ]
)


@settings(deadline=None)
@given(st.one_of(st.text(), st.lists(_YAML_PIECES, max_size=20).map("".join)))
def test_the_yaml_reader_raises_nothing_but_a_cluster_spec_error(text: str) -> None:
    with contextlib.suppress(ClusterSpecError):
        clusterspec.loads(text)
