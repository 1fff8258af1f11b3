"""Map a dataset's label names to a model's classes explicitly (names, synonyms, numeric ids, WordNet ids)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from profiling_agent.tools.data.sources import DataError, name_listing

_WNID = re.compile(r"^n\d{8}$")
_NUMERIC = re.compile(r"^(?:label_)?(\d+)$", re.IGNORECASE)


# ---------------------------------------------------------------- label mapping


def _norm(name: Any) -> str:
    """Normalize a class name: case-, underscore- and whitespace-insensitive."""
    return re.sub(r"[\s_]+", "", str(name).strip().lower())


def _int_keys(id2label: Mapping[Any, Any]) -> dict[int, str]:
    try:
        return {int(k): str(v) for k, v in id2label.items()}
    except (TypeError, ValueError):
        raise DataError("model id2label keys must be class ids (integers)") from None


def _index(pairs: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    table: dict[str, list[int]] = {}
    for key, model_id in pairs:
        ids = table.setdefault(key, [])
        if model_id not in ids:
            ids.append(model_id)
    return table


def _by_names(names: Sequence[str], labels: dict[int, str], synonyms: bool) -> tuple[dict[int, int], list[str]]:
    """Map dataset names to model ids by full label (and, with `synonyms`, comma-separated synonyms).

    Returns:
        ({dataset index: model id}, [problems for unmapped classes]).
    """
    full = _index((_norm(label), i) for i, label in labels.items())
    syn = _index((_norm(part), i) for i, label in labels.items() for part in label.split(",") if part.strip())
    mapped: dict[int, int] = {}
    problems: list[str] = []
    for index, name in enumerate(names):
        key = _norm(name)
        hits = full.get(key) or (syn.get(key) if synonyms else None) or []
        if len(hits) == 1:
            mapped[index] = hits[0]
        elif hits:
            problems.append(f"'{name}' matches several model classes ({name_listing(hits, 4)})")
        else:
            problems.append(f"'{name}'")
    return mapped, problems


def _by_number(names: Sequence[str], labels: dict[int, str]) -> dict[int, int] | None:
    """Map numeric names ("3", "LABEL_3") to the model class with the same number, when both sets are numeric."""
    ds_nums = [_NUMERIC.match(n.strip()) for n in names]
    model_nums = {i: _NUMERIC.match(label.strip()) for i, label in labels.items()}
    if not all(ds_nums) or not all(model_nums.values()) or len(names) != len(labels):
        return None
    number_to_id = {int(m.group(1)): i for i, m in model_nums.items() if m}
    wanted = [int(m.group(1)) for m in ds_nums if m]
    if sorted(wanted) != sorted(number_to_id) or len(set(wanted)) != len(wanted):
        return None
    return {index: number_to_id[number] for index, number in enumerate(wanted)}


def _by_wnid(names: Sequence[str], model_wnids: Mapping[int, str]) -> tuple[dict[int, int], list[str]]:
    table = _index((w.strip().lower(), i) for i, w in model_wnids.items())
    mapped, problems = {}, []
    for index, name in enumerate(names):
        hits = table.get(name.strip().lower(), [])
        if len(hits) == 1:
            mapped[index] = hits[0]
        else:
            problems.append(f"'{name}'" if not hits else f"'{name}' matches several model classes")
    return mapped, problems


def _as_id_map(model_wnids: Sequence[str] | Mapping[Any, str]) -> dict[int, str]:
    if isinstance(model_wnids, Mapping):
        return {int(k): str(v) for k, v in model_wnids.items()}
    return {i: str(w) for i, w in enumerate(model_wnids)}


def _fail(problems: list[str], n_names: int, labels: dict[int, str], what: str) -> DataError:
    generic = all(_NUMERIC.match(label.strip()) for label in labels.values())
    hint = " (the model's labels are generic LABEL_k/numbers: its config has no class names)" if generic else ""
    return DataError(
        f"{len(problems)} of {n_names} dataset classes match no {what}: {name_listing(problems, 4)}; model labels "
        f"e.g. {name_listing([repr(v) for v in list(labels.values())[:4]], 4)}{hint}"
    )


def _match(names: Sequence[str], labels: dict[int, str]) -> tuple[str, dict[int, int]]:
    """Try identical names, then synonyms, then numbers; return (method, mapping) or raise DataError."""
    mapped, problems = _by_names(names, labels, synonyms=False)
    if not problems:
        return "identical", mapped
    mapped, problems = _by_names(names, labels, synonyms=True)
    if not problems:
        return "synonym", mapped
    numeric = _by_number(names, labels)
    if numeric is not None:
        return "numeric", numeric
    raise _fail(problems, len(names), labels, "model label")


def map_labels(
    dataset_label_names: Sequence[str],
    id2label: Mapping[Any, Any],
    *,
    model_wnids: Sequence[str] | Mapping[Any, str] | None = None,
    wnid_names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Build an explicit mapping from dataset class indices to model class ids.

    Methods, tried in order: "identical" names (case-, underscore- and space-insensitive); "synonym"
    (one of the comma-separated names of an ImageNet-style label such as "tench, Tinca tinca"; a full
    label match wins over a synonym match); "numeric" (same-size sets of numbers such as "0".."9" vs
    "0".."9" or LABEL_0..). When every dataset name is a WordNet id (n01440764), the ids are matched
    against `model_wnids` ("wnid"), or translated with `wnid_names` and then matched by name
    ("wnid-table+identical" / "wnid-table+synonym"); without either table this raises: there is no
    offline WordNet here and wnids are never guessed.

    Args:
        dataset_label_names: Class names, index = dataset class id.
        id2label: The model config's id2label (int or str keys).
        model_wnids: The model's wnid per class id (see wnids_from_config), if it carries them.
        wnid_names: A wnid -> readable name table provided with the dataset.

    Returns:
        JSON-able {"method", "dataset_to_model": {"<dataset index>": model id} (string keys so the dict
        survives JSON; see mapping_table), "restricted": dataset classes are a strict subset of the
        model's, "allowed_ids": sorted model ids when restricted else None, "unmapped": [],
        "n_dataset_classes", "n_model_classes", "examples": a few "dataset -> model" strings}.

    Raises:
        DataError: Some dataset class maps to no model class (a few are listed), to several, or two
            dataset classes map to the same model class.
    """
    names = [str(n) for n in dataset_label_names]
    labels = _int_keys(id2label)
    if not names:
        raise DataError("the dataset has no class names")
    if not labels:
        raise DataError("the model config has no id2label")
    if all(_WNID.match(n.strip()) for n in names):
        method, mapped = _map_wnids(names, labels, model_wnids, wnid_names)
    else:
        method, mapped = _match(names, labels)
    _check_injective(mapped, names)
    used = sorted(set(mapped.values()))
    restricted = len(used) < len(labels)
    return {
        "method": method,
        "dataset_to_model": {str(i): int(mapped[i]) for i in range(len(names))},
        "restricted": restricted,
        "allowed_ids": used if restricted else None,
        "unmapped": [],
        "n_dataset_classes": len(names),
        "n_model_classes": len(labels),
        "examples": [f"{names[i]} -> {mapped[i]} {labels[mapped[i]]}" for i in range(min(5, len(names)))],
    }


def _map_wnids(
    names: list[str],
    labels: dict[int, str],
    model_wnids: Sequence[str] | Mapping[Any, str] | None,
    wnid_names: Mapping[str, str] | None,
) -> tuple[str, dict[int, int]]:
    if not model_wnids and all(_WNID.match(label.strip()) for label in labels.values()):
        model_wnids = labels  # the model's labels are wnids themselves
    if model_wnids:
        mapped, problems = _by_wnid(names, _as_id_map(model_wnids))
        if problems:
            raise DataError(
                f"{len(problems)} of {len(names)} dataset wnids are not in the model's wnid list: "
                f"{name_listing(problems, 4)}"
            )
        return "wnid", mapped
    if wnid_names:
        missing = [n for n in names if n not in wnid_names]
        if missing:
            raise DataError(f"the wnid->name table lacks {len(missing)} dataset classes: {name_listing(missing, 4)}")
        method, mapped = _match([str(wnid_names[n]) for n in names], labels)
        return f"wnid-table+{method}", mapped
    raise DataError(
        f"dataset classes are WordNet ids ({name_listing(names, 3)}) but the model config carries no wnid list; "
        "pass a wnid->name table (wnid_names) or use class-name folders"
    )


def _check_injective(mapped: dict[int, int], names: Sequence[str]) -> None:
    seen: dict[int, int] = {}
    for index, model_id in mapped.items():
        if model_id in seen:
            raise DataError(
                f"dataset classes '{names[seen[model_id]]}' and '{names[index]}' both map to model class {model_id}"
            )
        seen[model_id] = index


def wnids_from_config(config: Any) -> list[str] | None:
    """Return the model's WordNet id per class id when its config carries one, else None.

    Looks for a list or {id: wnid} attribute named wnids / label_wnids / imagenet_wnids, or an id2label
    whose labels are themselves wnids.
    """
    num = getattr(config, "num_labels", None)
    for attr in ("wnids", "label_wnids", "imagenet_wnids"):
        value = getattr(config, attr, None)
        if isinstance(value, Mapping):
            value = [value.get(i, value.get(str(i))) for i in range(len(value))]
        if isinstance(value, (list, tuple)) and value and (num is None or len(value) == num):
            if all(isinstance(w, str) and _WNID.match(w) for w in value):
                return list(value)
    labels = _int_keys(getattr(config, "id2label", {}) or {})
    if labels and all(_WNID.match(v.strip()) for v in labels.values()):
        return [labels[i] for i in sorted(labels)]
    return None


def mapping_table(mapping: Mapping[str, Any]) -> dict[int, int]:
    """Return map_labels' dataset_to_model as {dataset index (int): model id (int)}."""
    return {int(k): int(v) for k, v in mapping["dataset_to_model"].items()}
