"""What ``quotient demo`` applies: the users' workflows, the demo's own queues, and the scenario's manifests.

The users' workflows are the guides' seed files (``../shared/seeds``) when they are there, else our equivalents in
``deploy/examples``; they are applied through the emulator's API, so admission and validation apply as they would for
``kubectl apply``. The talk's queues, CPU pod, one-GPU pod and research pod come first (``SEED_FILES``); the two pairs
(``PAIR_FILES``: the talk's 0.5 + 0.25 pods, the vLLM guide's 0.7 + 0.2 Deployments) come later, in the order the
story (``quotient.demo_story``) chooses. The scenario's manifests are written as a user would write them (YAML with
the KAI and Quotient labels and annotations spelled out): a gang that does not fit at first, team-b's two-GPU pod that
reclaims from team-a, a pod with an invalid ``gpu-fraction``, and a quarter-GPU pod whose memory grows past its share.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from quotient.demo_view import meta_of
from quotient.emulator.deletion import DeleteOptions
from quotient.emulator.emulator import Emulator

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = REPO / "examples" / "clusters" / "demo.yaml"
SEEDS = REPO.parent / "shared" / "seeds"
EXAMPLES = REPO / "deploy" / "examples"
SEED_FILES = (
    "queues.yaml",
    "cpu-pod.yaml",
    "gpu-pod.yaml",
    "research-pod.yaml",
)
"""The talk's seeds applied at the start; its pair (``PAIR_FILES``) and the vLLM guide's come later, in the story."""
PAIR_FILES = ("gpu-sharing.yaml", "inference-pod.yaml", "vllm-test-07.yaml", "vllm-test-02.yaml")
EXAMPLE_PAIR_FILES = {
    "gpu-sharing.yaml": "talk/gpu-sharing.yaml",
    "inference-pod.yaml": "talk/inference-pod.yaml",
    "vllm-test-07.yaml": "vllm/vllm-test-07.yaml",
    "vllm-test-02.yaml": "vllm/vllm-test-02.yaml",
}


def _team_queue(name: str, *, gpu_quota: int, over_quota_weight: int) -> str:
    """A leaf queue under ``default`` with a GPU quota; CPU and memory without quota or limit."""
    return f"""
apiVersion: scheduling.run.ai/v2
kind: Queue
metadata: {{name: {name}}}
spec:
  parentQueue: default
  resources:
    gpu: {{quota: {gpu_quota}, limit: -1, overQuotaWeight: {over_quota_weight}}}
    cpu: {{quota: -1, limit: -1, overQuotaWeight: 1}}
    memory: {{quota: -1, limit: -1, overQuotaWeight: 1}}
"""


DEMO_QUEUES = "---".join(
    (
        _team_queue("team-a", gpu_quota=3, over_quota_weight=1),
        _team_queue("team-b", gpu_quota=4, over_quota_weight=3),
    )
)
"""team-a deserves 3 GPUs and will hold 5 (llm-train's 2 and the gang's 3); team-b deserves 4 and holds less until
it reclaims 2 (``RECLAIMER``): KAI's "guarantee deserved quota" reclaim, which leaves team-a its 3."""

GANG_NAME = "big-train"
GANG_SIZE = 3
GANG = f"""
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: {GANG_NAME}, namespace: team-a, labels: {{kai.scheduler/queue: team-a}}}}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: {GANG_SIZE}
      restartPolicy: Never
      template:
        metadata:
          annotations: {{quotient.dev/sim-gpu-memory: "20Gi@0s,60Gi@10s"}}
        spec:
          schedulerName: quotient
          containers:
          - name: pytorch
            image: pytorch/pytorch
            resources: {{limits: {{nvidia.com/gpu: "1"}}, requests: {{cpu: "4", memory: 32Gi}}}}
"""
"""A gang of one-GPU workers that cannot start until a GPU frees (2 are free when it comes, 3 once gpu-pod ends)."""

RECLAIMER_NAME = "finetune"
RECLAIMER_GPUS = 2
RECLAIMER = f"""
apiVersion: v1
kind: Pod
metadata:
  name: {RECLAIMER_NAME}
  namespace: team-b
  labels: {{kai.scheduler/queue: team-b}}
  annotations: {{quotient.dev/sim-gpu-memory: "30Gi@0s"}}
spec:
  schedulerName: quotient
  containers:
  - name: main
    image: pytorch/pytorch
    resources: {{limits: {{nvidia.com/gpu: "{RECLAIMER_GPUS}"}}, requests: {{cpu: "8", memory: 64Gi}}}}
"""
"""team-b's two-GPU pod on a full cluster, within team-b's quota: it reclaims from team-a, over its own."""

GREEDY = """
apiVersion: v1
kind: Pod
metadata:
  name: greedy
  namespace: team-b
  labels: {kai.scheduler/queue: team-b}
  annotations: {gpu-fraction: "0.25", quotient.dev/sim-gpu-memory: "4Gi@0s,30Gi@3s"}
spec:
  schedulerName: quotient
  containers: [{name: main, image: pytorch/pytorch}]
"""
"""A pod given a quarter of a GPU whose memory grows past it: the scheduler raises GpuMemoryOverconsumption."""

INVALID = """
apiVersion: v1
kind: Pod
metadata:
  name: bad-fraction
  namespace: team-b
  labels: {kai.scheduler/queue: team-b}
  annotations: {gpu-fraction: "1.7"}
spec:
  schedulerName: quotient
  containers: [{name: main, image: ubuntu}]
"""


def workflow_texts() -> tuple[str, list[str]]:
    """The talk guide's queues and pods: the seeds' own files, else our equivalents in deploy/examples."""
    if SEEDS.is_dir() and all((SEEDS / name).is_file() for name in SEED_FILES):
        return str(SEEDS), [(SEEDS / name).read_text() for name in SEED_FILES]
    pairs = {EXAMPLES / path for path in EXAMPLE_PAIR_FILES.values()}
    files = [EXAMPLES / "queues.yaml", *sorted(set((EXAMPLES / "talk").glob("*.yaml")) - pairs)]
    return str(EXAMPLES), [path.read_text() for path in files]


def seed_texts(*files: str) -> list[str]:
    """The pairs' manifests (``PAIR_FILES``): the seeds' own files, else our equivalents in deploy/examples."""
    if all((SEEDS / name).is_file() for name in files):
        return [(SEEDS / name).read_text() for name in files]
    return [(EXAMPLES / EXAMPLE_PAIR_FILES[name]).read_text() for name in files]


async def apply(emulator: Emulator, text: str, *, namespace: str | None = None) -> list[str]:
    """Create every object of a YAML text through the emulator's API (admission and validation included)."""
    created = []
    for obj in yaml.safe_load_all(text):
        if not isinstance(obj, dict):
            continue
        if namespace and obj.get("kind") not in ("Queue", "Namespace"):
            obj.setdefault("metadata", {}).setdefault("namespace", namespace)
        result = await emulator.create(obj)
        if isinstance(result, dict):
            created.append(f"{obj.get('kind')}/{meta_of(result).get('name')}")
        else:
            created.append(f"{obj.get('kind')}/{meta_of(obj).get('name')} refused: {result.message}")
    return created


async def delete_pod(emulator: Emulator, namespace: str, name: str) -> list[str]:
    """Delete a pod at once (no grace period); a line saying why when the API refused."""
    result = await emulator.api.delete(emulator.kind_of("v1", "Pod"), namespace, name, DeleteOptions(grace_period_s=0))
    return [] if isinstance(result, dict) else [f"Pod/{name} delete refused: {result.message}"]
