"""deploy/k8s as the tests read it: the manifest's documents by kind, Kubernetes label selectors, and the
server StatefulSets by the part they serve (one StatefulSet per part; its pods are that part's replicas)."""
from __future__ import annotations

from pathlib import Path

import yaml

PART_LABEL = "graphfeed.io/part"
PART_ENV = "GRAPHFEED_PART"


def documents(path: Path) -> dict[str, list[dict]]:
    """The manifest's documents by ``kind``, each kind's in file order."""
    by_kind: dict[str, list[dict]] = {}
    for doc in yaml.safe_load_all(path.read_text()):
        by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def selects(selector: dict, labels: dict) -> bool:
    """Whether the label selector ``selector`` (``matchLabels`` and ``matchExpressions``, as Kubernetes
    evaluates them: every term must hold) selects a pod labelled ``labels``.  An empty selector selects every
    pod.  ValueError for an operator Kubernetes does not have."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    return all(_holds(term, labels) for term in selector.get("matchExpressions", []))


def _holds(term: dict, labels: dict) -> bool:
    key, operator, values = term["key"], term["operator"], term.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise ValueError(f"no such label selector operator: {operator!r}")


def server_container(sts: dict) -> dict:
    """The one container of a server StatefulSet's pods."""
    [container] = sts["spec"]["template"]["spec"]["containers"]
    return container


def env(sts: dict) -> dict[str, dict]:
    """The server container's environment entries by name."""
    return {e["name"]: e for e in server_container(sts).get("env", [])}


def pod_labels(sts: dict) -> dict[str, str]:
    return sts["spec"]["template"]["metadata"]["labels"]


def statefulsets_by_part(docs: dict[str, list[dict]]) -> dict[int, dict]:
    """part -> the StatefulSet serving it, the part read from its fixed ``GRAPHFEED_PART`` value.
    AssertionError when a StatefulSet takes its part from elsewhere or two serve one part."""
    by_part: dict[int, dict] = {}
    for sts in docs.get("StatefulSet", []):
        name = sts["metadata"]["name"]
        entry = env(sts).get(PART_ENV, {})
        assert "value" in entry, f"{name}: {PART_ENV} is not a fixed value: {entry}"
        part = int(entry["value"])
        assert part not in by_part, f"part {part} has two StatefulSets: {by_part[part]['metadata']['name']}, {name}"
        by_part[part] = sts
    return by_part
