"""The YAML schema of a cluster spec: which keys a cluster, a node group, a pod group and their parts take.

``SpecReader`` walks the document from the root, reading each entry with the shapes of ``yamlreading`` and
building nodes as ``building`` does for every form. Checks that span entries (duplicate node or pod names, a pod
bound to an unknown node) are made here, with the line of the earlier entry in the error.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

import yaml

from common import names, quantities
from common.clusterspec import building, catalogue, checking, memoryscripts, spec, yamlreading

DEFAULT_SCHEDULER_NAME = "quotient"
DEFAULT_NAMESPACE = "default"
MAX_PODS = 1_000_000  # as building.MAX_NODES: far above any run we model

_CLUSTER_KEYS = ("nodes", "pods")
_NODE_KEYS = ("name", "count", "cpu", "memory", "pods", "labels", "taints", "gpus", "unowned_processes")
_GPU_KEYS = ("count", "model", "memory")
_TAINT_KEYS = ("key", "value", "effect")
_TOLERATION_KEYS = ("key", "operator", "value", "effect")
_UNOWNED_KEYS = ("gpu", "memory")
_POD_KEYS = (
    "name",
    "namespace",
    "count",
    "requests",
    "labels",
    "annotations",
    "node_selector",
    "tolerations",
    "scheduler_name",
    "queue",
    "node",
    "gpu_memory",
    "arrive",
    "duration",
)
_REQUEST_KEYS = ("cpu", "memory", names.GPU_RESOURCE)
_SHARE_ANNOTATIONS = (names.GPU_FRACTION_ANNOTATION, names.GPU_MEMORY_ANNOTATION)


class SpecReader(yamlreading.ShapeReader):
    """Reads a whole cluster spec from its root node; node and pod names are numbered across the whole document."""

    def __init__(self, source: str, loader: yaml.SafeLoader) -> None:
        super().__init__(source, loader)
        self._node_names = building.NameAllocator()
        self._pod_names = building.NameAllocator()

    def cluster(self, root: yaml.Node) -> spec.ClusterSpec:
        fields = self.fields(root, "", _CLUSTER_KEYS, required=("nodes",))
        nodes: list[spec.NodeSpec] = []
        node_lines: dict[str, int] = {}
        for index, entry in enumerate(self.items(fields["nodes"], "nodes")):
            for node in self.node_group(entry, f"nodes[{index}]", len(nodes)):
                if node.name in node_lines:
                    self.fail(
                        entry,
                        f"nodes[{index}]",
                        f"duplicate node name {node.name!r} (also on line {node_lines[node.name]})",
                    )
                node_lines[node.name] = entry.start_mark.line + 1
                nodes.append(node)
        if not nodes:
            self.fail(fields["nodes"], "nodes", "a cluster needs at least one node")
        pods: list[spec.PodSpec] = []
        pod_lines: dict[tuple[str, str], int] = {}
        for index, entry in enumerate(self.optional_items(fields, "pods", "")):
            path = f"pods[{index}]"
            for pod in self.pod_group(entry, path, len(pods)):
                if pod.node is not None and pod.node not in node_lines:
                    self.fail(
                        entry, f"{path}.node", f"unknown node {pod.node!r}{checking.suggest(pod.node, node_lines)}"
                    )
                key = (pod.namespace, pod.name)
                if key in pod_lines:
                    self.fail(entry, path, f"duplicate pod {pod.namespace}/{pod.name} (also on line {pod_lines[key]})")
                pod_lines[key] = entry.start_mark.line + 1
                pods.append(pod)
        return spec.ClusterSpec(nodes=tuple(nodes), pods=tuple(pods))

    def node_group(self, entry: yaml.Node, path: str, nodes_so_far: int) -> list[spec.NodeSpec]:
        fields = self.fields(entry, path, _NODE_KEYS)
        gpu_count, model = 0, None
        if "gpus" in fields:
            gpu_count, model = self.gpus(fields["gpus"], f"{path}.gpus")
        milli_cpu, memory = building.default_node_resources(gpu_count)
        if "cpu" in fields:
            milli_cpu = self.number(fields["cpu"], f"{path}.cpu", quantities.parse_millicores)
        if "memory" in fields:
            memory = self.number(fields["memory"], f"{path}.memory", quantities.parse_bytes)
        pods = building.DEFAULT_POD_SLOTS
        if "pods" in fields:
            pods = self.number(fields["pods"], f"{path}.pods", quantities.parse_count)
        labels = self.string_map(fields["labels"], f"{path}.labels", checking.check_label) if "labels" in fields else {}
        taints = tuple(
            self.taint(item, f"{path}.taints[{index}]")
            for index, item in enumerate(self.optional_items(fields, "taints", path))
        )
        unowned = tuple(
            self.unowned(item, f"{path}.unowned_processes[{index}]", gpu_count, model)
            for index, item in enumerate(self.optional_items(fields, "unowned_processes", path))
        )
        return [
            building.build_node(
                name,
                milli_cpu=milli_cpu,
                memory_bytes=memory,
                pods=pods,
                gpu_count=gpu_count,
                model=model,
                labels=labels,
                taints=taints,
                unowned=unowned,
            )
            for name in self.group_names(
                fields, path, self._node_names, scope="", limit=building.MAX_NODES - nodes_so_far
            )
        ]

    def group_names(
        self, fields: Mapping[str, yaml.Node], path: str, allocator: building.NameAllocator, *, scope: str, limit: int
    ) -> list[str]:
        """One exact name, or ``count`` names PREFIX-i (the prefix being the name, or ``node`` for nodes)."""
        what = "pod name" if allocator is self._pod_names else "node name"
        if "count" not in fields:
            if "name" not in fields:
                return [allocator.take(building.DEFAULT_NODE_PREFIX, scope=scope)]
            return [self.name(fields["name"], f"{path}.name", lambda text: checking.check_name(text, what))]
        count = self.number(fields["count"], f"{path}.count", quantities.parse_count, minimum=1)
        if count > limit:
            self.fail(fields["count"], f"{path}.count", f"{count} is too many; at most {limit} more are supported")
        prefix = self.text(fields["name"], f"{path}.name") if "name" in fields else building.DEFAULT_NODE_PREFIX
        taken = [allocator.take(prefix, scope=scope) for _ in range(count)]
        for name in taken:
            try:
                checking.check_name(name, what)
            except checking.Invalid as exc:
                self.fail(fields.get("name", fields["count"]), f"{path}.name", str(exc))
        return taken

    def gpus(self, node: yaml.Node, path: str) -> tuple[int, catalogue.GpuModel | None]:
        fields = self.fields(node, path, _GPU_KEYS, required=("count",))
        count = self.number(fields["count"], f"{path}.count", quantities.parse_count)
        if count > building.MAX_GPUS_PER_NODE:
            self.fail(
                fields["count"],
                f"{path}.count",
                f"{count} GPUs per node; at most {building.MAX_GPUS_PER_NODE} are supported",
            )
        memory = self.number(fields["memory"], f"{path}.memory", quantities.parse_bytes) if "memory" in fields else None
        model = self.text(fields["model"], f"{path}.model") if "model" in fields else None
        try:
            return count, building.gpu_group(count, model, memory)
        except checking.Invalid as exc:
            self.fail(fields.get("model", node), f"{path}.model" if "model" in fields else path, str(exc))

    def taint(self, node: yaml.Node, path: str) -> spec.Taint:
        try:
            if isinstance(node, yaml.ScalarNode):
                return spec.parse_taint(self.text(node, path))
            fields = self.fields(node, path, _TAINT_KEYS, required=("key", "effect"))
            value = self.text(fields["value"], f"{path}.value", allow_bool=True) if "value" in fields else ""
            return spec.make_taint(
                self.text(fields["key"], f"{path}.key"), value, self.text(fields["effect"], f"{path}.effect")
            )
        except checking.Invalid as exc:
            self.fail(node, path, str(exc))

    def toleration(self, node: yaml.Node, path: str) -> spec.Toleration:
        fields = self.fields(node, path, _TOLERATION_KEYS)
        found = {key: self.text(value, f"{path}.{key}", allow_bool=key == "value") for key, value in fields.items()}
        try:
            return spec.make_toleration(
                found.get("key", ""), found.get("operator"), found.get("value", ""), found.get("effect")
            )
        except checking.Invalid as exc:
            self.fail(node, path, str(exc))

    def unowned(
        self, node: yaml.Node, path: str, gpu_count: int, model: catalogue.GpuModel | None
    ) -> spec.UnownedProcess:
        fields = self.fields(node, path, _UNOWNED_KEYS, required=("gpu", "memory"))
        process = spec.UnownedProcess(
            gpu_index=self.number(fields["gpu"], f"{path}.gpu", quantities.parse_count),
            memory=self.script(fields["memory"], f"{path}.memory"),
        )
        try:
            building.check_unowned(process, gpu_count, model)
        except checking.Invalid as exc:
            self.fail(node, path, str(exc))
        return process

    def pod_group(self, entry: yaml.Node, path: str, pods_so_far: int) -> list[spec.PodSpec]:
        fields = self.fields(entry, path, _POD_KEYS, required=("name",))
        namespace = DEFAULT_NAMESPACE
        if "namespace" in fields:
            namespace = self.name(fields["namespace"], f"{path}.namespace", checking.check_namespace)
        milli_cpu, memory, gpus = self.requests(fields, path)
        labels = self.string_map(fields["labels"], f"{path}.labels", checking.check_label) if "labels" in fields else {}
        annotations = (
            self.string_map(
                fields["annotations"], f"{path}.annotations", lambda key, _: checking.check_key(key, "annotation")
            )
            if "annotations" in fields
            else {}
        )
        node_selector = {}
        if "node_selector" in fields:
            node_selector = self.string_map(fields["node_selector"], f"{path}.node_selector", checking.check_label)
        tolerations = tuple(
            self.toleration(item, f"{path}.tolerations[{index}]")
            for index, item in enumerate(self.optional_items(fields, "tolerations", path))
        )
        queue = self.queue(fields, labels, path)
        script = self.pod_script(fields, annotations, path)
        if script is not None:
            annotations[names.SIM_GPU_MEMORY_ANNOTATION] = script.text()
            if gpus == 0 and not any(key in annotations for key in _SHARE_ANNOTATIONS):
                self.fail(
                    entry,
                    path,
                    f"a GPU memory script needs a GPU: request {names.GPU_RESOURCE} or set "
                    f"{names.GPU_FRACTION_ANNOTATION} or {names.GPU_MEMORY_ANNOTATION}",
                )
        scheduler = DEFAULT_SCHEDULER_NAME
        if "scheduler_name" in fields:
            scheduler = self.name(
                fields["scheduler_name"],
                f"{path}.scheduler_name",
                lambda text: checking.check_name(text, "scheduler name"),
            )
        node_name = self.text(fields["node"], f"{path}.node") if "node" in fields else None
        arrive_ns = (
            self.number(fields["arrive"], f"{path}.arrive", quantities.parse_duration_ns) if "arrive" in fields else 0
        )
        duration_ns = None
        if "duration" in fields:
            duration_ns = self.number(fields["duration"], f"{path}.duration", quantities.parse_duration_ns, minimum=1)
        frozen_labels = types.MappingProxyType(labels)
        frozen_annotations = types.MappingProxyType(annotations)
        frozen_selector = types.MappingProxyType(node_selector)
        return [
            spec.PodSpec(
                name=name,
                namespace=namespace,
                milli_cpu=milli_cpu,
                memory_bytes=memory,
                gpus=gpus,
                labels=frozen_labels,
                annotations=frozen_annotations,
                node_selector=frozen_selector,
                tolerations=tolerations,
                scheduler_name=scheduler,
                queue=queue,
                node=node_name,
                gpu_memory=script,
                arrive_ns=arrive_ns,
                duration_ns=duration_ns,
            )
            for name in self.group_names(fields, path, self._pod_names, scope=namespace, limit=MAX_PODS - pods_so_far)
        ]

    def requests(self, fields: Mapping[str, yaml.Node], path: str) -> tuple[int, int, int]:
        """A pod's (milli_cpu, memory_bytes, whole GPUs), each 0 when not requested."""
        requests = self.fields(fields["requests"], f"{path}.requests", _REQUEST_KEYS) if "requests" in fields else {}
        milli_cpu = (
            self.number(requests["cpu"], f"{path}.requests.cpu", quantities.parse_millicores)
            if "cpu" in requests
            else 0
        )
        memory = (
            self.number(requests["memory"], f"{path}.requests.memory", quantities.parse_bytes)
            if "memory" in requests
            else 0
        )
        gpus = 0
        if names.GPU_RESOURCE in requests:
            gpu_node = requests[names.GPU_RESOURCE]
            gpu_path = f"{path}.requests.{names.GPU_RESOURCE}"
            try:
                gpus = checking.parse(quantities.parse_count, self.text(gpu_node, gpu_path), "GPUs")
            except checking.Invalid as exc:
                self.fail(
                    gpu_node,
                    gpu_path,
                    f"{exc} (whole devices; for a share, use the {names.GPU_FRACTION_ANNOTATION} or "
                    f"{names.GPU_MEMORY_ANNOTATION} annotation)",
                )
        return milli_cpu, memory, gpus

    def queue(self, fields: Mapping[str, yaml.Node], labels: dict[str, str], path: str) -> str | None:
        """The pod's queue, from ``queue`` or its queue label, which ``queue`` sets when absent."""
        queue = labels.get(names.QUEUE_LABEL)
        if "queue" in fields:
            queue_node = fields["queue"]
            queue = self.name(queue_node, f"{path}.queue", lambda text: checking.check_label(names.QUEUE_LABEL, text))
            if labels.get(names.QUEUE_LABEL, queue) != queue:
                self.fail(
                    queue_node,
                    f"{path}.queue",
                    f"contradicts the label {names.QUEUE_LABEL}={labels[names.QUEUE_LABEL]}",
                )
            labels[names.QUEUE_LABEL] = queue
        return queue

    def pod_script(
        self, fields: Mapping[str, yaml.Node], annotations: Mapping[str, str], path: str
    ) -> memoryscripts.MemoryScript | None:
        """The pod's memory script, from ``gpu_memory`` or, equally, from its annotation; never both."""
        written = annotations.get(names.SIM_GPU_MEMORY_ANNOTATION)
        if "gpu_memory" in fields:
            if written is not None:
                self.fail(
                    fields["gpu_memory"],
                    f"{path}.gpu_memory",
                    f"also given as the annotation {names.SIM_GPU_MEMORY_ANNOTATION}; keep one",
                )
            return self.script(fields["gpu_memory"], f"{path}.gpu_memory")
        if written is None:
            return None
        try:
            return memoryscripts.script_from_text(written)
        except checking.Invalid as exc:
            self.fail(fields["annotations"], f"{path}.annotations.{names.SIM_GPU_MEMORY_ANNOTATION}", str(exc))
