from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ClusterSpecError
from common.quantities import MIB
from scheduler.sim import openb

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_nodes_load_in_file_order_with_memory_in_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes.csv", NODE_HEADER + "n-0,64000,262144,2,P100\nn-1,96000,393216,8,G2\n")
    nodes = openb.load_nodes(path)
    assert [node.name for node in nodes] == ["n-0", "n-1"]
    assert nodes[0] == openb.TraceNode(
        name="n-0", milli_cpu=64000, memory_bytes=262144 * MIB, gpu_count=2, gpu_model="P100"
    )


def test_pods_load_shares_whole_gpus_models_and_times(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pods.csv",
        POD_HEADER
        + "p-0,6000,12288,1,460,,LS,Running,427061,12902960,427061\n"
        + "p-1,88000,400000,8,1000,V100M16|V100M32,BE,Failed,5,9,\n"
        + "p-2,12500,1024,0,0,,BE,Running,1,2,3\n",
    )
    share, multi, cpu_only = openb.load_pods(path)
    assert (share.gpu_count, share.milli_gpu, share.kind, share.creation_s) == (1, 460, "fractional", 427061)
    assert multi.gpu_models == frozenset({"V100M16", "V100M32"})
    assert (multi.kind, multi.total_milli_gpu, multi.scheduled_s) == ("multi_gpu", 8000, None)
    assert (cpu_only.kind, cpu_only.memory_bytes) == ("cpu_only", 1024 * MIB)


def test_pod_lists_with_only_the_five_first_columns_load(tmp_path: Path) -> None:
    path = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np-0,3152,5600,1,810\n")
    (pod,) = openb.load_pods(path)
    assert pod.gpu_models == frozenset()
    assert pod.creation_s is None


@pytest.mark.parametrize(
    ("row", "complaint"),
    [
        ("p-1,abc,12288,1,460,,LS,Running,1,2,3", "cpu_milli is 'abc', expected an integer"),
        ("p-1,-5,12288,1,460,,LS,Running,1,2,3", "cpu_milli is -5"),
        ("p-1,6000,12288,1,1460,,LS,Running,1,2,3", "gpu_milli is 1460"),
        ("p-1,6000,12288,2,500,,LS,Running,1,2,3", "shares are on one device"),
        ("p-1,6000,12288,0,500,,LS,Running,1,2,3", "gpu_milli is 500 but num_gpu is 0"),
        ("p-1,6000,12288,1,0,,LS,Running,1,2,3", "num_gpu is 1 but gpu_milli is 0"),
        ("p-1,6000,12288,0,0,T4,LS,Running,1,2,3", "asks for no GPU"),
        ("p-1,6000,12288,1,460,,LS", "7 fields, the header has 11"),
        ("p-0,6000,12288,1,460,,LS,Running,1,2,3", "pod 'p-0' already appears on line 2"),
        ("p-1,6000,12288,1,460,,LS,Running,soon,2,3", "creation_time is 'soon'"),
    ],
)
def test_a_malformed_pod_row_is_refused_with_its_file_and_line(tmp_path: Path, row: str, complaint: str) -> None:
    path = write(tmp_path, "pods.csv", POD_HEADER + "p-0,6000,12288,1,460,,LS,Running,1,2,3\n" + row + "\n")
    with pytest.raises(ClusterSpecError) as caught:
        openb.load_pods(path)
    assert f"{path}:3:" in str(caught.value)
    assert complaint in str(caught.value)


@pytest.mark.parametrize(
    ("row", "complaint"),
    [
        ("n-1,64000,262144,two,P100", "gpu is 'two'"),
        ("n-1,64000,262144,2,", "has 2 GPUs but no model"),
        ("n-0,64000,262144,2,P100", "node 'n-0' already appears on line 2"),
        (",64000,262144,2,P100", "sn (the node name) is empty"),
    ],
)
def test_a_malformed_node_row_is_refused_with_its_file_and_line(tmp_path: Path, row: str, complaint: str) -> None:
    path = write(tmp_path, "nodes.csv", NODE_HEADER + "n-0,64000,262144,2,P100\n" + row + "\n")
    with pytest.raises(ClusterSpecError) as caught:
        openb.load_nodes(path)
    assert f"{path}:3:" in str(caught.value)
    assert complaint in str(caught.value)


def test_a_header_without_a_required_column_is_refused_on_line_one(tmp_path: Path) -> None:
    path = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu\np-0,1,1,0\n")
    with pytest.raises(ClusterSpecError, match=r"pods.csv:1: header lacks column\(s\) gpu_milli"):
        openb.load_pods(path)


def test_an_empty_or_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ClusterSpecError, match="empty file"):
        openb.load_nodes(write(tmp_path, "nodes.csv", ""))
    with pytest.raises(ClusterSpecError, match="no pods"):
        openb.load_pods(write(tmp_path, "pods.csv", POD_HEADER))
    with pytest.raises(ClusterSpecError, match="cannot read"):
        openb.load_pods(tmp_path / "absent.csv")


def test_the_trace_name_comes_from_the_published_file_names() -> None:
    assert openb.trace_name(Path("/x/openb_pod_list_gpushare40.csv")) == "gpushare40"
    assert openb.trace_name(Path("/x/mine.csv")) is None
