"""Custom resources checked offline against their CRDs' openAPIV3Schema (tests/fixtures/crds,
fetched unedited from the projects' released tags; tests/fixtures/SOURCES.md).

As strict as `kubectl apply --validate=strict` (the API server's strict field validation): an
object with `properties` takes no other field unless it says x-kubernetes-preserve-unknown-fields.
Without strict (the API server's default) an unknown field is let through, as the API server
prunes it with no more than a warning. Object metadata is checked as
the API server checks it (a DNS-1123 name, valid label keys and values). Not checked: the CRDs'
CEL rules (x-kubernetes-validations) and formats.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parent / "fixtures" / "crds"
# The fixture for each kind (group, kind) -> file.
FILES = {
    ("jobset.x-k8s.io", "JobSet"): "jobset.x-k8s.io_jobsets.yaml",
    ("kueue.x-k8s.io", "LocalQueue"): "kueue.x-k8s.io_localqueues.yaml",
    ("kueue.x-k8s.io", "WorkloadPriorityClass"): "kueue.x-k8s.io_workloadpriorityclasses.yaml",
    ("monitoring.coreos.com", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
}
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def _closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others."""
    if isinstance(schema, dict):
        schema = {key: _closed(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    return schema


@functools.cache
def _crd(file: str) -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the JobSet CRD is 800 KB
    with (CRDS / file).open() as stream:
        document = yaml.load(stream, Loader=loader)
    assert isinstance(document, dict) and document["kind"] == "CustomResourceDefinition"
    return document


@functools.cache
def validator(api_version: str, kind: str, strict: bool = True) -> jsonschema.Draft7Validator:
    group, version = api_version.split("/")
    crd = _crd(FILES[(group, kind)])
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    schema = copy.deepcopy(served["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(_closed(schema) if strict else schema)


def _label_errors(labels: Mapping[str, Any], where: str) -> Iterator[str]:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if prefix and (len(prefix) > 253 or not _NAME.match(prefix)):
            yield f"{where}: label key prefix {prefix!r}"
        if len(name) > 63 or not _LABEL_NAME.match(name):
            yield f"{where}: label key {key!r}"
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            yield f"{where}: label value {value!r} of {key}"


def _metadata_errors(document: Any, where: str = "") -> Iterator[str]:
    """Every metadata in the document (the object's, and its templates')."""
    if isinstance(document, dict):
        meta = document.get("metadata")
        if isinstance(meta, dict):
            name = meta.get("name")
            if name is not None and (len(name) > 253 or not _NAME.match(name)):
                yield f"{where}metadata.name {name!r}"
            yield from _label_errors(meta.get("labels") or {}, f"{where}metadata.labels")
        for key, value in document.items():
            yield from _metadata_errors(value, f"{where}{key}.")
    elif isinstance(document, list):
        for index, item in enumerate(document):
            yield from _metadata_errors(item, f"{where}{index}.")


def errors(document: Mapping[str, Any], strict: bool = True) -> list[str]:
    """Why the API server would refuse `document`; empty when it would take it."""
    check = validator(document["apiVersion"], document["kind"], strict)
    found = [
        f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in check.iter_errors(document)
    ]
    return found + list(_metadata_errors(dict(document)))
