"""Drain3 state as plain JSON: save, load with field-by-field checks, migrate old files once.

Drain3's ``TemplateMiner`` saves its ``Drain`` with ``jsonpickle``, and loading such a file
imports and calls whatever the file names: a tampered state file runs code. This module keeps
the same information as plain data and never calls jsonpickle::

    {"format": "seqenc-drain3-state", "version": 1,
     "miner": {"depth": 4, "sim_th": 0.5, "max_children": 100, "max_clusters": null,
               "extra_delimiters": [], "param_str": "<*>", "parametrize_numeric_tokens": true},
     "clusters_counter": 17,
     "clusters": [{"id": 1, "template_tokens": ["BLOCK*", "NameSystem.allocateBlock:", "<PATH>", "<BLK>"],
                   "size": 30}, ...],
     "tree": {"cluster_ids": [], "children": {"4": {"cluster_ids": [], "children": {...}}, ...}},
     "word_split": {"max_words": 3, "words": [[id, [["word", ...] or null per position]], ...],
                    "events": [[template id, ["word", ...], event id], ...]}}

``word_split`` (parsers.word_split) is there when the format splits templates by words; a file
without it (older ones) loads with no words seen yet.

Choices:

* The prefix tree is saved as it is (children in their order, cluster ids per leaf) rather than
  rebuilt from the templates: Drain's tree depends on the order clusters were added and on
  templates that generalised later, so only the saved tree continues exactly. ``clusters`` keep
  Drain's order (least recently used first when ``max_clusters`` bounds them).
* Loading checks every field (types, ranges, known keys only, ids that exist, tree depth) and
  restores nothing until all of it passed. The settings that shape the tree (everything in
  ``miner`` but ``sim_th``) must equal the running miner's; ``sim_th`` is only a threshold,
  so the format's current value is used (with a warning when the file differs).
* Anything that is not this format is refused with a ``ValueError`` naming the file and what to
  do, except a state file in the old format (jsonpickle, as written by ``TemplateMiner``, often
  zlib-compressed and base64-encoded): it is read *as JSON data* -- only the class names of a
  Drain3 state are accepted, as tags, and never imported; ``py/id`` references are resolved by
  hand -- converted, and rewritten in the new format once, with a warning.

:class:`DrainStateFile` is the persistence interface (``load(drain)``, ``save(drain, reason)``)
that parsers.logs' miner uses in place of Drain3's byte-level ``PersistenceHandler``.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import logging
import zlib
from pathlib import Path

from cachetools import LRUCache
from drain3.drain import DrainBase, LogCluster, LogClusterCache, Node

from parsers import objectstore, storage

logger = logging.getLogger(__name__)

FORMAT = "seqenc-drain3-state"
VERSION = 1
MAX_INFLATED_BYTES = 1 << 30  # an old compressed state larger than this is refused
ADVICE = ("Delete it to start a fresh template tree (templates then get new ids), "
          "or put back a state file written by seqenc.")

_TOP_KEYS = {"format", "version", "miner", "clusters_counter", "clusters", "tree"}
_MINER_KEYS = {"depth", "sim_th", "max_children", "max_clusters", "extra_delimiters", "param_str",
               "parametrize_numeric_tokens"}
_CLUSTER_KEYS = {"id", "template_tokens", "size"}
_NODE_KEYS = {"cluster_ids", "children"}


class StateError(ValueError):
    """State data that is not a valid seqenc Drain3 state (the message says what is wrong)."""


# ---------------------------------------------------------------- the new format: dump and load

def dump_state(drain: DrainBase, word_split=None) -> dict:
    """The drain's clusters, prefix tree and settings (and the miner's word splits) as plain JSON data."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "miner": miner_settings(drain),
        "clusters_counter": drain.clusters_counter,
        "clusters": [{"id": c.cluster_id, "template_tokens": list(c.log_template_tokens), "size": c.size}
                     for c in _clusters_in_order(drain)],
        "tree": _dump_node(drain.root_node),
    } | ({"word_split": word_split.dump()} if word_split is not None and (word_split.max_words or word_split.words)
         else {})


def miner_settings(drain: DrainBase) -> dict:
    return {
        "depth": drain.log_cluster_depth,
        "sim_th": drain.sim_th,
        "max_children": drain.max_children,
        "max_clusters": drain.max_clusters,
        "extra_delimiters": list(drain.extra_delimiters),
        "param_str": drain.param_str,
        "parametrize_numeric_tokens": drain.parametrize_numeric_tokens,
    }


def _clusters_in_order(drain: DrainBase) -> list[LogCluster]:
    """Clusters in the order that restores Drain's: as stored, or least recently used first for
    an LRU-bounded drain (a copy of the cache is emptied through its public ``popitem``)."""
    clusters = drain.id_to_cluster
    if not isinstance(clusters, LRUCache):
        return list(clusters.values())
    lru = copy.copy(clusters)
    return [lru.popitem()[1] for _ in range(len(lru))]


def _dump_node(node: Node) -> dict:
    return {"cluster_ids": list(node.cluster_ids),
            "children": {token: _dump_node(child) for token, child in node.key_to_child_node.items()}}


def load_state(data: object, drain: DrainBase, word_split=None) -> None:
    """Check ``data`` (parsed JSON) field by field and restore it into ``drain``.

    Raises :class:`StateError` (a ``ValueError``) on the first problem; ``drain`` is changed
    only when everything passed."""
    optional = {"word_split"} & set(data) if isinstance(data, dict) else set()  # absent before issue 49
    top = _fields(data, _TOP_KEYS | optional, "the state")
    if top["format"] != FORMAT:
        raise StateError(f"format is {top['format']!r}, expected {FORMAT!r}")
    if top["version"] != VERSION or not _is_int(top["version"]):
        raise StateError(f"version is {top['version']!r}; this seqenc reads version {VERSION}")
    settings = _check_settings(_fields(top["miner"], _MINER_KEYS, "miner"), drain)
    counter = _int(top["clusters_counter"], "clusters_counter", low=0)

    clusters: dict[int, LogCluster] = {}
    if not isinstance(top["clusters"], list):
        raise StateError("clusters is not a list")
    for i, item in enumerate(top["clusters"]):
        fields = _fields(item, _CLUSTER_KEYS, f"clusters[{i}]")
        cid = _int(fields["id"], f"clusters[{i}].id", low=1, high=counter)
        tokens = fields["template_tokens"]
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise StateError(f"clusters[{i}].template_tokens is not a list of strings")
        if cid in clusters:
            raise StateError(f"cluster id {cid} appears twice")
        cluster = LogCluster(tokens, cid)
        cluster.size = _int(fields["size"], f"clusters[{i}].size", low=1)
        clusters[cid] = cluster
    if settings["max_clusters"] is not None and len(clusters) > settings["max_clusters"]:
        raise StateError(f"{len(clusters)} clusters, more than max_clusters={settings['max_clusters']}")

    in_tree: set[int] = set()
    root = _load_node(top["tree"], "tree", 0, drain.max_node_depth, counter, in_tree)
    if settings["max_clusters"] is None and in_tree != set(clusters):  # a bounded drain may keep evicted ids
        raise StateError(f"the tree and the clusters disagree on cluster ids {sorted(in_tree ^ set(clusters))[:5]}")

    if "word_split" in top and word_split is not None:  # checks all of it before it changes the split
        word_split.load(top["word_split"], _check)

    # all checked: restore
    if settings["max_clusters"] is None:
        drain.id_to_cluster = clusters
    else:
        cache = LogClusterCache(maxsize=settings["max_clusters"])
        cache.update(clusters)  # in saved order: least recently used first
        drain.id_to_cluster = cache
    drain.clusters_counter = counter
    drain.root_node = root


def _check_settings(miner: dict, drain: DrainBase) -> dict:
    """The saved settings, type-checked; those that shape the tree must equal the drain's."""
    _int(miner["depth"], "miner.depth", low=3)
    _int(miner["max_children"], "miner.max_children", low=1)
    if miner["max_clusters"] is not None:
        _int(miner["max_clusters"], "miner.max_clusters", low=1)
    if not isinstance(miner["extra_delimiters"], list) or not all(isinstance(d, str) for d in miner["extra_delimiters"]):
        raise StateError("miner.extra_delimiters is not a list of strings")
    if not isinstance(miner["param_str"], str):
        raise StateError("miner.param_str is not a string")
    if not isinstance(miner["parametrize_numeric_tokens"], bool):
        raise StateError("miner.parametrize_numeric_tokens is not true or false")
    sim_th = miner["sim_th"]
    if isinstance(sim_th, bool) or not isinstance(sim_th, int | float) or not 0 <= sim_th <= 1:
        raise StateError("miner.sim_th is not a number between 0 and 1")

    running = miner_settings(drain)
    changed = [k for k in sorted(_MINER_KEYS - {"sim_th"}) if miner[k] != running[k]]
    if changed:
        diffs = ", ".join(f"{k}: saved {miner[k]!r}, now {running[k]!r}" for k in changed)
        raise StateError(f"the template tree was built with other settings ({diffs})")
    if sim_th != running["sim_th"]:
        logger.warning("Drain3 state was saved with sim_th=%s; continuing with the format's %s",
                       sim_th, running["sim_th"])
    return miner


def _load_node(data: object, where: str, depth: int, max_depth: int, counter: int, seen: set[int]) -> Node:
    """One prefix-tree node (and its subtree); ``depth`` 0 is the root, leaves sit at most at
    Drain's ``max_node_depth``."""
    if depth > max_depth:
        raise StateError(f"{where} is deeper than the tree's depth allows")
    fields = _fields(data, _NODE_KEYS, where)
    node = Node()
    ids = fields["cluster_ids"]
    if not isinstance(ids, list):
        raise StateError(f"{where}.cluster_ids is not a list")
    node.cluster_ids = [_int(cid, f"{where}.cluster_ids", low=1, high=counter) for cid in ids]
    seen.update(node.cluster_ids)
    children = fields["children"]
    if not isinstance(children, dict):
        raise StateError(f"{where}.children is not an object")
    for token, child in children.items():
        if depth == 0 and not token.isdigit():  # the first level counts tokens
            raise StateError(f"{where}.children has {token!r} where a token count belongs")
        node.key_to_child_node[token] = _load_node(child, f"{where}.children[{token!r}]", depth + 1,
                                                   max_depth, counter, seen)
    return node


def _fields(data: object, keys: set[str], where: str) -> dict:
    """``data`` as a JSON object with exactly ``keys``."""
    if not isinstance(data, dict):
        raise StateError(f"{where} is not a JSON object")
    missing, unknown = keys - data.keys(), data.keys() - keys
    if missing:
        raise StateError(f"{where} lacks {', '.join(sorted(missing))}")
    if unknown:
        raise StateError(f"{where} has unknown keys {', '.join(sorted(unknown))}")
    return data


def _check(ok: object, where: str) -> None:
    if not ok:
        raise StateError(f"{where} is not valid")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: object, where: str, low: int, high: int | None = None) -> int:
    if not _is_int(value) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in {low}..{high}"
        raise StateError(f"{where} is {value!r}, not an integer {bounds}")
    return value


def find_pickle_tags(data: object) -> str | None:
    """The first key starting with ``py/`` anywhere in ``data`` (jsonpickle's tags), or None."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key.startswith("py/"):
                    return key
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return None


# ---------------------------------------------------------------- the file

class DrainStateFile:
    """One state file (``<root>/state/drain3-<source>.json``): ``load(drain)`` and
    ``save(drain, reason)``. Writes are atomic (parsers.storage); an old jsonpickle file is
    migrated on load."""

    def __init__(self, path: str | Path) -> None:
        self.path = objectstore.as_path(path)  # an s3:// key too (parsers.objectstore)

    def save(self, drain: DrainBase, reason: str = "", word_split=None) -> None:
        state = dump_state(drain, word_split)  # counted from the dump: reading a bounded drain's clusters reorders its LRU
        text = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
        storage.write_bytes_atomic(text.encode("utf-8"), self.path)
        logger.info("saved Drain3 state of %d clusters (%d messages) to %s%s", len(state["clusters"]),
                    sum(c["size"] for c in state["clusters"]), self.path, f" ({reason})" if reason else "")

    def load(self, drain: DrainBase, word_split=None) -> bool:
        """Restore ``drain`` from the file; False when there is no file yet."""
        if not self.path.exists():
            logger.info("no Drain3 state at %s: starting a fresh template tree", self.path)
            return False
        data, old = self._read()
        kind = "an old Drain3 (jsonpickle) state that cannot be migrated: " if old else ""
        try:
            if old:
                data = from_jsonpickle(data)
            elif tag := find_pickle_tags(data):
                raise StateError(f"contains the jsonpickle tag {tag!r}")
            load_state(data, drain, word_split)
        except StateError as e:
            raise self._refused(kind + str(e)) from None
        except RecursionError:
            raise self._refused(kind + "nested too deeply") from None
        if old:
            self.save(drain, "migration", word_split)
            logger.warning("migrated %s from Drain3's jsonpickle format to %s version %d (%d clusters)",
                           self.path, FORMAT, VERSION, len(drain.clusters))
        logger.info("restored %d Drain3 clusters from %s", len(drain.clusters), self.path)
        return True

    def _read(self) -> tuple[object, bool]:
        """The file's JSON data, and whether it is the old jsonpickle format. Drain3 compresses
        old states (zlib, then base64) unless configured not to; the new format never is."""
        raw = self.path.read_bytes()
        if not raw.strip():
            raise self._refused("the file is empty")
        if not raw.lstrip().startswith(b"{"):
            raw = self._inflate(raw)
        try:
            data = json.loads(raw)  # NaN / Infinity parse, but no field accepts them
        except (ValueError, RecursionError) as e:
            raise self._refused(f"not valid JSON ({e})") from None
        return data, isinstance(data, dict) and "format" not in data and "py/object" in data

    def _inflate(self, raw: bytes) -> bytes:
        try:
            packed = base64.b64decode(raw.strip(), validate=True)
            inflater = zlib.decompressobj()
            text = inflater.decompress(packed, MAX_INFLATED_BYTES)
        except (binascii.Error, zlib.error):
            raise self._refused("neither JSON nor a compressed Drain3 state") from None
        if inflater.unconsumed_tail:
            raise self._refused(f"a compressed state larger than {MAX_INFLATED_BYTES} bytes")
        if not text.lstrip().startswith(b"{"):
            raise self._refused("a compressed state that is not a JSON object")
        return text

    def _refused(self, reason: str) -> ValueError:
        return ValueError(f"Drain3 state file {self.path} is not a seqenc Drain3 state "
                          f"({FORMAT} version {VERSION}): {reason}. It was not loaded. {ADVICE}")


# ---------------------------------------------------------------- migration from Drain3's jsonpickle format

DRAIN_CLASSES = {"drain3.drain.Drain", "parsers.drain.MaskAwareDrain", "parsers.drain.ShapeAwareDrain"}
CACHE_CLASSES = {"drain3.drain.LogClusterCache", "cachetools.LRUCache"}
NODE_CLASS, CLUSTER_CLASS = "drain3.drain.Node", "drain3.drain.LogCluster"
NULL_PROFILER = "drain3.simple_profiler.NullProfiler"
KNOWN_CLASSES = DRAIN_CLASSES | CACHE_CLASSES | {NODE_CLASS, CLUSTER_CLASS, NULL_PROFILER}

_DRAIN_ATTRS = {"log_cluster_depth", "sim_th", "max_children", "root_node", "id_to_cluster", "clusters_counter"}
_DRAIN_OPTIONAL = {"max_node_depth": None, "profiler": None, "extra_delimiters": [], "max_clusters": None,
                   "param_str": "<*>", "parametrize_numeric_tokens": True}
_CACHE_ATTRS = {"_Cache__data", "_Cache__currsize", "_Cache__maxsize", "_LRUCache__order"}
_ORDERED_DICT_REDUCE = [{"py/type": "collections.OrderedDict"}, {"py/tuple": []}, None, None]
_PENDING = object()  # a py/id target still being read (a reference to it would be a cycle)


class _Tagged:
    """A ``py/object`` of an old file: the class name (a tag, never imported) and attributes."""

    def __init__(self, name: str, attrs: dict) -> None:
        self.name, self.attrs = name, attrs


class _PickleData:
    """Reads jsonpickle output as plain data.

    It visits values in the order jsonpickle's unpickler does and numbers the same ones
    (objects, lists, dicts, reduce values; 0-based), so ``{"py/id": n}`` resolves to the n-th.
    Accepted tags: ``py/object`` (known class names only), ``py/state``, ``py/tuple``, ``py/id``,
    and the one ``py/reduce`` shape an ``OrderedDict`` takes (the LRU order of a bounded
    drain); anything else is refused."""

    def __init__(self) -> None:
        self.refs: list = []

    def value(self, data: object) -> object:
        if data is None or isinstance(data, str | int | float | bool):
            return data
        if isinstance(data, list):
            return self._numbered(lambda: [self.value(v) for v in data])
        tags = [k for k in data if k.startswith("py/")]
        if not tags:
            return self._numbered(lambda: self._dict(data))
        if "py/object" in data:
            return self._object(data)
        if len(data) != 1:
            raise StateError(f"unexpected jsonpickle tags {', '.join(sorted(data))}")
        if "py/tuple" in data and isinstance(data["py/tuple"], list):
            return tuple(self.value(v) for v in data["py/tuple"])
        if "py/id" in data:
            return self._resolve(data["py/id"])
        if "py/reduce" in data:
            return self._numbered(lambda: self._ordered_dict(data["py/reduce"]))
        raise StateError(f"unexpected jsonpickle tag {tags[0]!r}")

    def _numbered(self, read):
        """Number a value before reading its contents, as the unpickler does."""
        self.refs.append(_PENDING)
        at = len(self.refs) - 1
        self.refs[at] = result = read()
        return result

    def _resolve(self, n: object) -> object:
        if not _is_int(n) or not 0 <= n < len(self.refs):
            raise StateError(f"py/id {n!r} refers to nothing read before it")
        if self.refs[n] is _PENDING:
            raise StateError(f"py/id {n} refers to a value that contains it")
        return self.refs[n]

    def _dict(self, data: dict) -> dict:
        """String keys first, then the escaped ``json://`` keys (decoded: ints or strings only),
        in the unpickler's two phases."""
        out = {k: self.value(v) for k, v in data.items() if not k.startswith("json://")}
        for k, v in data.items():
            if k.startswith("json://"):
                try:
                    key = json.loads(k[len("json://"):])
                except ValueError:
                    raise StateError(f"dict key {k!r} is not JSON") from None
                if not isinstance(key, str) and not _is_int(key):
                    raise StateError(f"dict key {k!r} is neither a number nor a string")
                out[key] = self.value(v)
        return out

    def _object(self, data: dict) -> _Tagged:
        name = data["py/object"]
        if name not in KNOWN_CLASSES:
            raise StateError(f"class {name!r} is not part of a Drain3 state")
        extra = [k for k in data if k.startswith("py/") and k not in ("py/object", "py/state")]
        if extra:
            raise StateError(f"{name} carries {', '.join(extra)}")
        tagged = _Tagged(name, {})

        def read():
            tagged.attrs = {k: self.value(v) for k, v in data.items() if not k.startswith("py/")}
            if "py/state" in data:  # __getstate__ output: a dict, or (dict, slots dict)
                state = self.value(data["py/state"])
                parts = state if isinstance(state, tuple | list) and len(state) == 2 else (state,)
                for part in parts:
                    if part is not None and not isinstance(part, dict):
                        raise StateError(f"{name} has a py/state that is not attributes")
                    tagged.attrs.update(part or {})
            return tagged

        return self._numbered(read)

    def _ordered_dict(self, items: object) -> dict:
        padded = items + [None] * (5 - len(items)) if isinstance(items, list) else []  # trailing Nones are cut
        if len(padded) != 5 or padded[:4] != _ORDERED_DICT_REDUCE:
            raise StateError("a py/reduce other than an OrderedDict's")
        pairs = () if padded[4] is None else self.value(padded[4])
        if not isinstance(pairs, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
            raise StateError("an OrderedDict whose items are not pairs")
        return dict(pairs)


def from_jsonpickle(data: dict) -> dict:
    """An old state (``jsonpickle.dumps(drain, keys=True)``, parsed as JSON) in the new format.

    Only the structure is checked here; :func:`load_state` then checks the result like any new
    file. Raises :class:`StateError` for anything that is not a Drain3 state."""
    drain = _attrs(_PickleData().value(data), DRAIN_CLASSES, "the state", _DRAIN_ATTRS, set(_DRAIN_OPTIONAL))
    drain = {**_DRAIN_OPTIONAL, **drain}
    if drain["profiler"] is not None:
        _attrs(drain["profiler"], {NULL_PROFILER}, "profiler", set())
    delimiters = drain["extra_delimiters"]
    return {
        "format": FORMAT,
        "version": VERSION,
        "miner": {
            "depth": drain["log_cluster_depth"],
            "sim_th": drain["sim_th"],
            "max_children": drain["max_children"],
            "max_clusters": drain["max_clusters"],
            "extra_delimiters": list(delimiters) if isinstance(delimiters, tuple | list) else delimiters,
            "param_str": drain["param_str"],
            "parametrize_numeric_tokens": drain["parametrize_numeric_tokens"],
        },
        "clusters_counter": drain["clusters_counter"],
        "clusters": _old_clusters(drain["id_to_cluster"], drain["max_clusters"]),
        "tree": _old_node(drain["root_node"], "root_node"),
    }


def _attrs(value: object, classes: set[str], where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
    """The attributes of a tagged object of one of ``classes``: all of ``required``, and
    nothing outside ``required | optional``."""
    if not isinstance(value, _Tagged) or value.name not in classes:
        raise StateError(f"{where} is not a {' or '.join(sorted(classes))}")
    missing, unknown = required - value.attrs.keys(), value.attrs.keys() - required - optional
    if missing or unknown:
        raise StateError(f"{where} ({value.name}) lacks {sorted(missing)} or has unknown {sorted(unknown)}")
    return value.attrs


def _old_clusters(id_to_cluster: object, max_clusters: object) -> list[dict]:
    """Clusters in Drain's order: a plain dict's, or an LRU cache's use order."""
    if isinstance(id_to_cluster, _Tagged):
        cache = _attrs(id_to_cluster, CACHE_CLASSES, "id_to_cluster", _CACHE_ATTRS)
        by_id, order = cache["_Cache__data"], cache["_LRUCache__order"]
        if not isinstance(by_id, dict) or not isinstance(order, dict) or set(order) != set(by_id):
            raise StateError("id_to_cluster: the LRU order and the cached clusters disagree")
        if cache["_Cache__maxsize"] != max_clusters:
            raise StateError("id_to_cluster: the cache size is not max_clusters")
        items = [(k, by_id[k]) for k in order]
    elif isinstance(id_to_cluster, dict):
        items = list(id_to_cluster.items())
    else:
        raise StateError("id_to_cluster is not a mapping")
    out = []
    for key, value in items:
        cluster = _attrs(value, {CLUSTER_CLASS}, f"cluster {key!r}", {"log_template_tokens", "cluster_id", "size"})
        if str(key) != str(cluster["cluster_id"]):  # drain3 <= 0.9.1 wrote ids as string keys
            raise StateError(f"cluster {key!r} holds cluster_id {cluster['cluster_id']!r}")
        tokens = cluster["log_template_tokens"]
        out.append({"id": cluster["cluster_id"], "size": cluster["size"],
                    "template_tokens": list(tokens) if isinstance(tokens, tuple | list) else tokens})
    return out


def _old_node(value: object, where: str) -> dict:
    node = _attrs(value, {NODE_CLASS}, where, {"key_to_child_node", "cluster_ids"})
    children, ids = node["key_to_child_node"], node["cluster_ids"]
    if not isinstance(children, dict) or not all(isinstance(k, str) for k in children):
        raise StateError(f"{where}.key_to_child_node is not a mapping of tokens")
    return {"cluster_ids": list(ids) if isinstance(ids, tuple | list) else ids,
            "children": {token: _old_node(child, f"{where}[{token!r}]") for token, child in children.items()}}
