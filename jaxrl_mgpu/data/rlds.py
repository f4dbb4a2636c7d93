"""Learning histories as RLDS episodes in a TFDS array_record dataset, without TensorFlow.

On disk, a dataset directory is a TFDS builder directory (`tfds.builder_from_directory(dir)`
opens it) with one split, "train", whose examples are RLDS episodes:

    steps:          tfds.features.Dataset of
        observation   [*obs_shape]   (float32 for the Dark Rooms)
        action        [*action_shape] (int32 scalar for discrete actions)
        reward        float32
        discount      float32        0 where the step is terminal, else 1
        is_first      bool           the episode's first step
        is_last       bool           the episode's last step
        is_terminal   bool           a true end (is_last without is_terminal: truncation)
    task:           [*task_shape]  the task (the goal cell for the Dark Rooms)
    task_index:     int32          which learning history (0 .. num_tasks - 1)
    episode_index:  int32          the episode's position in that history

Each step is one transition (o_t, a_t, r_t); `is_last` marks the last transition of an episode,
which carries a real action and reward (as in Open X-Embodiment). The observation after it is
not stored: in a learning history the next episode starts from a reset anyway.

Examples are stored in order (task-major, then episode) with shuffling disabled, so a task's
episodes are a contiguous run of example indices and a reader can fetch one task's history
without reading the others. The dataset's metadata (`tfds.core.MetadataDict`, readable with
`info(dir)` or `builder.info.metadata`) holds what the writer was given (env, algo, config, ...)
plus the layout: `num_tasks`, `steps_per_task`, `episodes_per_task`.

Corruption: `shards.json` records each shard file's size and SHA-256; `read` checks them before
reading and RAISES a DatasetError naming the file (never skips: a learning history with a hole is
silently wrong data for a trainer). Writing goes to a hidden staging directory next to the target
and is renamed into place at the end, so nothing half-written is ever visible under the target.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
from array_record.python import array_record_module

import tensorflow_datasets as tfds
# The numpy parser of TFDS's tf.Example records: it parses a whole episode into stacked arrays.
# The public decode path (`as_data_source()[i]["steps"]`) decodes step by step in Python, far
# slower; tests check both agree.
from tensorflow_datasets.core import example_parser
from tensorflow_datasets.proto import tf_example_pb2, tf_feature_pb2

from jaxrl_mgpu.cli import UserError

SPLIT = "train"
NAME, VERSION = "learning_histories", "1.0.0"  # the dataset's name and version in its dataset_info.json
FILENAME_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"  # TFDS's default
CHECKSUMS = "shards.json"
STEP_FIELDS = ("observation", "action", "reward", "discount", "is_first", "is_last", "is_terminal")
LAYOUT_KEYS = ("num_tasks", "steps_per_task", "episodes_per_task")


class DatasetError(UserError):
    """A dataset that cannot be written or read as asked (the CLI prints it as one line)."""


@dataclasses.dataclass(frozen=True)
class Histories:
    """Whole learning histories, one row per task, steps contiguous across episode boundaries."""
    observation: np.ndarray   # [tasks, steps, *obs_shape]
    action: np.ndarray        # [tasks, steps, *action_shape]
    reward: np.ndarray        # [tasks, steps] float32
    done: np.ndarray          # [tasks, steps] bool: last step of an episode (RLDS is_last)
    terminated: np.ndarray    # [tasks, steps] bool: a true end (RLDS is_terminal)
    task: np.ndarray          # [tasks, *task_shape]
    metadata: dict = dataclasses.field(default_factory=dict)

    @property
    def num_tasks(self) -> int:
        return self.reward.shape[0]

    @property
    def num_steps(self) -> int:
        return self.reward.shape[1]


# ----------------------------------------------------------------------------- writing


def _tensor(x: np.ndarray) -> tfds.features.Tensor:
    """A feature for one item shaped and typed like `x`."""
    return tfds.features.Tensor(shape=x.shape, dtype=x.dtype)


def bytes_tensor(x: np.ndarray) -> tfds.features.Tensor:
    """A feature for one item shaped and typed like `x`, stored as its raw bytes: TFDS's
    standard BYTES encoding, many times faster to write and read than a list of floats."""
    return tfds.features.Tensor(shape=x.shape, dtype=x.dtype, encoding=tfds.features.Encoding.BYTES)


def byte_rows(x: np.ndarray) -> np.ndarray:
    """Items [n, ...] as the BYTES encoding of a sequence feature stores them: one bytes per row."""
    return np.array([row.tobytes() for row in x], dtype=object)


def _is_bytes(feature) -> bool:
    return getattr(feature, "_encoding", None) == tfds.features.Encoding.BYTES


def steps_feature(observation: np.ndarray, action: np.ndarray) -> tfds.features.Dataset:
    """The RLDS `steps` feature for one observation and one action (item shapes and dtypes).
    Its encoder takes an episode's steps as whole arrays [n, ...] in one go: the stored bytes
    are the same as TFDS's per-step encoding (which stacks each step's arrays), far faster,
    and the dataset's feature spec stays the standard `tfds.features.Dataset`.
    Observations are stored as raw bytes (`bytes_tensor`)."""
    spec = {"observation": bytes_tensor(observation), "action": _tensor(action), "reward": np.float32,
            "discount": np.float32, "is_first": np.bool_, "is_last": np.bool_, "is_terminal": np.bool_}
    feature = tfds.features.Dataset(spec)
    dtypes = {k: np.dtype(f.np_dtype) for k, f in feature.feature.items()}
    shapes = {k: tuple(f.shape) for k, f in feature.feature.items()}

    def encode_whole_episode(steps: dict) -> dict:
        encoded = {k: np.asarray(steps[k], dtypes[k]) for k in spec}
        n = len(encoded["reward"])
        for k, v in encoded.items():
            if v.shape != (n,) + shapes[k]:
                raise DatasetError(f"step field {k!r} has shape {v.shape}, expected {(n,) + shapes[k]}")
        encoded["observation"] = byte_rows(encoded["observation"])
        return encoded

    feature.encode_example = encode_whole_episode  # this instance only; the class (and spec) stay TFDS's
    return feature


def _features(h: Histories) -> tfds.features.FeaturesDict:
    return tfds.features.FeaturesDict({
        "steps": steps_feature(h.observation[0, 0], h.action[0, 0]),
        "task": _tensor(h.task[0]),
        "task_index": np.int32,
        "episode_index": np.int32,
    })


def episode_bounds(done: np.ndarray) -> list[np.ndarray]:
    """Per task, the end (exclusive) of each episode, from the `done` flags [tasks, steps]."""
    return [np.flatnonzero(row) + 1 for row in done]


def _examples(h: Histories, ends: list[np.ndarray]) -> Iterator[tuple[int, dict]]:
    key = 0
    for t, task_ends in enumerate(ends):
        for e, (start, stop) in enumerate(zip(np.concatenate([[0], task_ends[:-1]]), task_ends)):
            n = stop - start
            terminal = h.terminated[t, start:stop].astype(bool)
            steps = {"observation": h.observation[t, start:stop], "action": h.action[t, start:stop],
                     "reward": h.reward[t, start:stop].astype(np.float32),
                     "discount": (~terminal).astype(np.float32),
                     "is_first": np.arange(n) == 0, "is_last": np.arange(n) == n - 1, "is_terminal": terminal}
            yield key, {"steps": steps, "task": h.task[t], "task_index": t, "episode_index": e}
            key += 1  # with shuffling disabled, TFDS stores examples in key order


def _jsonable(x: Any) -> Any:
    if isinstance(x, (np.ndarray, np.generic)):
        return x.tolist()
    raise DatasetError(f"metadata value {x!r} ({type(x).__name__}) is not JSON-serialisable")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _shard_files(builder_dir: Path) -> list[Path]:
    return sorted(builder_dir.glob(f"*-{SPLIT}.array_record-*"))


def write(path: str | os.PathLike, histories: Histories) -> Path:
    """Writes `histories` (every task's history must end on a `done` step) to a new dataset at
    `path` (absent or empty). `histories.metadata` must name the "env"; it is stored as JSON with
    the layout keys added. Returns the dataset directory."""
    path = Path(path).absolute()
    h = histories
    if "env" not in h.metadata:
        raise DatasetError("metadata must name the environment ('env')")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise DatasetError(f"{path} exists and is not an empty directory")
    if h.num_tasks == 0 or h.num_steps == 0 or not h.done[:, -1].all():
        raise DatasetError("every task's history must be non-empty and end on a done step")
    ends = episode_bounds(h.done)
    layout = {"num_tasks": h.num_tasks, "steps_per_task": h.num_steps,
              "episodes_per_task": [len(e) for e in ends]}
    metadata = json.loads(json.dumps({**h.metadata, **layout}, default=_jsonable))

    return build(path, _features(h), metadata, lambda: _examples(h, ends))


def serializer(features: tfds.features.FeaturesDict) -> Callable[[dict], bytes]:
    """`features`' examples as TFDS stores them (a tf.Example), whole arrays at a time: the same
    tf.Example as TFDS's serializer, which converts a sequence feature's items one by one in
    Python (an order of magnitude slower), serialized deterministically (its features in key
    order). For features of one sequence level at most (all of ours: TFDS stores deeper ones
    as ragged row lengths)."""
    specs = tfds.core.utils.flatten_nest_dict(features.get_serialized_info())
    nested = [k for k, info in specs.items() if info.sequence_rank > 1]
    if nested:
        raise DatasetError(f"feature {nested[0]!r} is a sequence of sequences, which rlds.serializer does not write")

    def feature(key: str, value, info) -> tf_feature_pb2.Feature:
        v = np.asanyarray(value, dtype=info.np_dtype)
        if v.ndim != len(info.shape) or any(s is not None and s != d for s, d in zip(info.shape, v.shape)):
            raise DatasetError(f"feature {key!r} has shape {v.shape}, expected {tuple(info.shape)}")
        flat = v.reshape(-1)
        if v.dtype == object:  # BYTES-encoded tensors: one bytes per item
            return tf_feature_pb2.Feature(bytes_list=tf_feature_pb2.BytesList(value=list(flat)))
        if v.dtype == np.bool_ or v.dtype.kind in "iu":  # tf.Example has no bool; uint64 as int64, as TFDS
            flat = flat.view(np.int64) if v.dtype == np.uint64 else flat.astype(np.int64, copy=False)
            return tf_feature_pb2.Feature(int64_list=tf_feature_pb2.Int64List(value=flat))
        return tf_feature_pb2.Feature(float_list=tf_feature_pb2.FloatList(value=flat))

    def serialize(example: dict) -> bytes:
        flat = tfds.core.utils.flatten_nest_dict(features.encode_example(example))
        return tf_example_pb2.Example(features=tf_feature_pb2.Features(
            feature={k: feature(k, flat[k], info) for k, info in specs.items()})).SerializeToString(deterministic=True)

    return serialize


def build(path: Path, features: tfds.features.FeaturesDict, metadata: dict, examples) -> Path:
    """Writes the examples `examples()` yields ((key, example), in order) as a TFDS
    array_record dataset at `path`: the files a TFDS builder writes (one array_record file,
    dataset_info.json, features.json, metadata.json: `tfds.builder_from_directory` opens it),
    written directly, since TFDS's builder machinery adds fixed work per dataset (its
    shuffler's 1,000 bucket paths among it) on top of the serializer (`serializer`). Built in a
    hidden sibling directory (same filesystem), then renamed onto `path` — the rename is
    atomic, so no reader ever sees a partial dataset — with each data file's size and SHA-256
    recorded in `shards.json` for `verify`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir()
        template = tfds.core.ShardedFileTemplate(data_dir=tfds.core.Path(staging), template=FILENAME_TEMPLATE,
                                                 dataset_name=NAME, split=SPLIT, filetype_suffix="array_record")
        serialize, count, size = serializer(features), 0, 0
        writer = array_record_module.ArrayRecordWriter(os.fspath(template.sharded_filepath(shard_index=0, num_shards=1)),
                                                       "group_size:1")  # TFDS's options for its array_record files
        try:
            for _, example in examples():
                record = serialize(example)
                writer.write(record)
                count, size = count + 1, size + len(record)
        finally:
            writer.close()
        info = tfds.core.DatasetInfo(
            builder=tfds.core.dataset_info.DatasetIdentity(name=NAME, version=tfds.core.Version(VERSION),
                                                           data_dir=os.fspath(staging), module_name=__name__),
            features=features, metadata=tfds.core.MetadataDict(metadata),
            disable_shuffling=True,  # keep each task's episodes contiguous and in order
            description=(f"Learning histories of {metadata.get('algo', '?')} on {metadata.get('env', '?')} as "
                         f"RLDS episodes (jaxrl_mgpu.data.rlds)."))
        info.set_file_format(tfds.core.FileFormat.ARRAY_RECORD)
        info.set_splits(tfds.core.SplitDict([tfds.core.SplitInfo(name=SPLIT, shard_lengths=[count], num_bytes=size,
                                                                 filename_template=template)]))
        info.write_to_directory(staging)
        files = {f.name: {"bytes": f.stat().st_size, "sha256": _sha256(f)} for f in _shard_files(staging)}
        (staging / CHECKSUMS).write_text(json.dumps({"split": SPLIT, "files": files}, indent=1))
        os.rename(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


# ----------------------------------------------------------------------------- reading


def _open(path: Path):
    if not (path / "dataset_info.json").is_file():
        missing = "dataset_info.json" if path.is_dir() else "directory"
        raise DatasetError(f"no dataset at {path} (missing {missing})")
    try:
        builder = tfds.builder_from_directory(path)
        builder.info.metadata  # read lazily by TFDS: a garbled metadata.json fails here, not later
        return builder
    except Exception as e:  # TFDS raises several kinds for a broken dataset_info/features/metadata file
        raise DatasetError(f"cannot open the dataset at {path}: {type(e).__name__}: {e}".splitlines()[0]) from e


def info(path: str | os.PathLike) -> dict:
    """The dataset's metadata: what the writer was given (env, algo, ...) plus the layout keys."""
    return dict(_open(Path(path).absolute()).info.metadata or {})


def verify(path: str | os.PathLike) -> None:
    """Checks every shard file against the sizes and SHA-256 recorded at write time."""
    path = Path(path).absolute()
    record = path / CHECKSUMS
    if not record.is_file():
        raise DatasetError(f"{record} is missing: not a complete jaxrl_mgpu dataset")
    files = json.loads(record.read_text())["files"]
    for name, expected in files.items():
        f = path / name
        if not f.is_file():
            raise DatasetError(f"shard {f} is missing")
        if f.stat().st_size != expected["bytes"]:
            raise DatasetError(f"shard {f} is truncated or corrupt: {f.stat().st_size} bytes, "
                               f"expected {expected['bytes']}")
        if _sha256(f) != expected["sha256"]:
            raise DatasetError(f"shard {f} is corrupt: its SHA-256 differs from the one recorded at write time")


def read(path: str | os.PathLike, env: str | None = None, tasks: Iterable[int] | None = None) -> Histories:
    """Reads the learning histories of `tasks` (default: all, in order) as contiguous arrays.
    `env`, when given, must be the dataset's environment. Raises DatasetError for a missing or
    corrupt dataset, or one of another environment."""
    path = Path(path).absolute()
    builder = _open(path)
    metadata = dict(builder.info.metadata or {})
    if env is not None and metadata.get("env") != env:
        raise DatasetError(f"{path} holds episodes of {metadata.get('env')!r}, not {env!r}")
    if any(k not in metadata for k in LAYOUT_KEYS):
        raise DatasetError(f"{path} has no layout metadata ({', '.join(LAYOUT_KEYS)}): not written by jaxrl_mgpu")
    verify(path)

    offsets = np.concatenate([[0], np.cumsum(metadata["episodes_per_task"])])
    tasks = list(range(metadata["num_tasks"]) if tasks is None else tasks)
    if not tasks or any(not 0 <= t < metadata["num_tasks"] for t in tasks):
        raise DatasetError(f"task indices must be in 0..{metadata['num_tasks'] - 1}; got {tasks}")
    try:
        source = builder.as_data_source(SPLIT, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
        if len(source) != offsets[-1]:
            raise DatasetError(f"{path} holds {len(source)} episodes; its metadata says {offsets[-1]}")
        parser = episode_parser(builder.info.features)
        rows = [_read_task(parser, source, t, offsets[t], offsets[t + 1], metadata["steps_per_task"])
                for t in tasks]
    except DatasetError:
        raise
    except Exception as e:  # array_record raises RuntimeError on a damaged file
        raise DatasetError(f"cannot read {path}: {type(e).__name__}: {e}".splitlines()[0]) from e
    return Histories(**{k: np.stack([r[k] for r in rows]) for k in rows[0]}, metadata=metadata)


def episode_parser(features: tfds.features.FeaturesDict) -> Callable[[bytes], dict]:
    """Parses one stored episode record into numpy arrays, whole episode at a time (TFDS's
    numpy tf.Example parser; its public decode path goes step by step, far slower), and
    turns BYTES-encoded tensors back into arrays."""
    parser = example_parser.ExampleParserNp(features.get_serialized_info())
    raw = lambda f: (np.dtype(f.np_dtype), tuple(f.shape))  # noqa: E731
    # per sequence feature (`steps`, and any other tfds.features.Dataset), its BYTES fields
    sequence_bytes = {name: {k: raw(f) for k, f in feature.feature.items() if _is_bytes(f)}
                      for name, feature in features.items() if isinstance(feature, tfds.features.Dataset)}
    top_bytes = {k: raw(f) for k, f in features.items() if k not in sequence_bytes and _is_bytes(f)}

    def parse(record: bytes) -> dict:
        e = parser.parse_example(record)
        for name, fields in sequence_bytes.items():
            for k, (dtype, shape) in fields.items():
                rows = e[name][k]
                e[name][k] = np.frombuffer(b"".join(rows), dtype).reshape((len(rows),) + shape)
        for k, (dtype, shape) in top_bytes.items():
            e[k] = np.frombuffer(e[k], dtype).reshape(shape)
        return e

    return parse


_PARSERS: dict[str, Callable[[bytes], dict]] = {}  # features.json -> its episode_parser


def records(path: str | os.PathLike) -> list[dict]:
    """Every record of the dataset at `path` in order, parsed (`episode_parser`), its files'
    checksums verified first. Read with array_record directly, with the parser kept per feature
    spec (features.json): a process that reads many datasets of one layout (the store's shards)
    skips TFDS's builder and data source, which cost several times the reading and parsing of
    a shard."""
    path = Path(path).absolute()
    verify(path)
    try:
        spec = (path / "features.json").read_text()
        if spec not in _PARSERS:
            _PARSERS[spec] = episode_parser(tfds.features.FeatureConnector.from_json(json.loads(spec)))
        out = []
        for f in _shard_files(path):
            reader = array_record_module.ArrayRecordReader(os.fspath(f))
            try:
                out += [_PARSERS[spec](r) for r in reader.read_all()]
            finally:
                reader.close()
        return out
    except Exception as e:  # array_record raises RuntimeError on a damaged file
        raise DatasetError(f"cannot read {path}: {type(e).__name__}: {e}".splitlines()[0]) from e


def _read_task(parser, source, task: int, start: int, stop: int, num_steps: int) -> dict:
    """One task's episodes [start, stop) concatenated into [num_steps] arrays, after checking
    they are the task's episodes in order with consistent RLDS flags."""
    episodes = [parser(r) for r in source.__getitems__(range(start, stop))]
    if [(int(e["task_index"]), int(e["episode_index"])) for e in episodes] != \
            [(task, i) for i in range(stop - start)]:
        raise DatasetError(f"episodes {start}..{stop - 1} are not task {task}'s history in order")
    steps = {k: np.concatenate([e["steps"][k] for e in episodes]) for k in STEP_FIELDS}
    # The flags must cut the concatenated steps exactly where the episodes end.
    lengths = [len(e["steps"]["reward"]) for e in episodes]
    last = np.zeros(sum(lengths), bool)
    last[np.cumsum(lengths) - 1] = True
    first = np.concatenate([[True], last[:-1]])
    if len(last) != num_steps or not (np.array_equal(steps["is_last"], last)
                                      and np.array_equal(steps["is_first"], first)):
        raise DatasetError(f"task {task}'s history has {len(last)} steps (expected {num_steps}) "
                           f"or misplaced is_first/is_last flags")
    return {"observation": steps["observation"], "action": steps["action"], "reward": steps["reward"],
            "done": steps["is_last"], "terminated": steps["is_terminal"], "task": episodes[0]["task"]}


# ----------------------------------------------------------------------------- sharding


def shard(num_items: int, num_shards: int, index: int) -> range:
    """The contiguous block of items (tasks, episodes) for shard `index` of `num_shards`
    (a device, or a process: `shard(n, jax.process_count(), jax.process_index())`). Every shard
    gets `num_items // num_shards` items, so data-parallel shards stay the same size; the last
    `num_items % num_shards` items are dropped."""
    if not 0 <= index < num_shards:
        raise DatasetError(f"shard index {index} is not in 0..{num_shards - 1}")
    per_shard = num_items // num_shards
    if per_shard == 0:
        raise DatasetError(f"{num_items} items cannot be split over {num_shards} shards")
    return range(index * per_shard, (index + 1) * per_shard)
