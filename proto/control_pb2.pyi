from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClusterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FeatureInfo(_message.Message):
    __slots__ = ("name", "shape", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...

class EdgeType(_message.Message):
    __slots__ = ("src", "rel", "dst")
    SRC_FIELD_NUMBER: _ClassVar[int]
    REL_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    src: str
    rel: str
    dst: str
    def __init__(self, src: _Optional[str] = ..., rel: _Optional[str] = ..., dst: _Optional[str] = ...) -> None: ...

class ClusterInfo(_message.Message):
    __slots__ = ("server_version", "format_version", "graph_name", "fingerprint", "num_parts", "part_id", "node_ranges", "num_edges", "features", "num_classes", "split_sizes", "local_split_sizes", "topologies", "data_address", "node_types", "edge_types", "label_type", "num_nodes_by_type", "data_path", "worker_start_seconds")
    class SplitSizesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class LocalSplitSizesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class NumNodesByTypeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    GRAPH_NAME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTS_FIELD_NUMBER: _ClassVar[int]
    PART_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_RANGES_FIELD_NUMBER: _ClassVar[int]
    NUM_EDGES_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    SPLIT_SIZES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_SPLIT_SIZES_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGIES_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPES_FIELD_NUMBER: _ClassVar[int]
    EDGE_TYPES_FIELD_NUMBER: _ClassVar[int]
    LABEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_BY_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_PATH_FIELD_NUMBER: _ClassVar[int]
    WORKER_START_SECONDS_FIELD_NUMBER: _ClassVar[int]
    server_version: str
    format_version: int
    graph_name: str
    fingerprint: str
    num_parts: int
    part_id: int
    node_ranges: _containers.RepeatedScalarFieldContainer[int]
    num_edges: int
    features: _containers.RepeatedCompositeFieldContainer[FeatureInfo]
    num_classes: int
    split_sizes: _containers.ScalarMap[str, int]
    local_split_sizes: _containers.ScalarMap[str, int]
    topologies: _containers.RepeatedScalarFieldContainer[str]
    data_address: str
    node_types: _containers.RepeatedScalarFieldContainer[str]
    edge_types: _containers.RepeatedCompositeFieldContainer[EdgeType]
    label_type: str
    num_nodes_by_type: _containers.ScalarMap[str, int]
    data_path: str
    worker_start_seconds: float
    def __init__(self, server_version: _Optional[str] = ..., format_version: _Optional[int] = ..., graph_name: _Optional[str] = ..., fingerprint: _Optional[str] = ..., num_parts: _Optional[int] = ..., part_id: _Optional[int] = ..., node_ranges: _Optional[_Iterable[int]] = ..., num_edges: _Optional[int] = ..., features: _Optional[_Iterable[_Union[FeatureInfo, _Mapping]]] = ..., num_classes: _Optional[int] = ..., split_sizes: _Optional[_Mapping[str, int]] = ..., local_split_sizes: _Optional[_Mapping[str, int]] = ..., topologies: _Optional[_Iterable[str]] = ..., data_address: _Optional[str] = ..., node_types: _Optional[_Iterable[str]] = ..., edge_types: _Optional[_Iterable[_Union[EdgeType, _Mapping]]] = ..., label_type: _Optional[str] = ..., num_nodes_by_type: _Optional[_Mapping[str, int]] = ..., data_path: _Optional[str] = ..., worker_start_seconds: _Optional[float] = ...) -> None: ...

class OpenGroupRequest(_message.Message):
    __slots__ = ("group_id", "rendezvous", "world_size", "rank", "lease_seconds", "group_key", "data_path", "job")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GROUP_KEY_FIELD_NUMBER: _ClassVar[int]
    DATA_PATH_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    rendezvous: str
    world_size: int
    rank: int
    lease_seconds: float
    group_key: bytes
    data_path: str
    job: str
    def __init__(self, group_id: _Optional[str] = ..., rendezvous: _Optional[str] = ..., world_size: _Optional[int] = ..., rank: _Optional[int] = ..., lease_seconds: _Optional[float] = ..., group_key: _Optional[bytes] = ..., data_path: _Optional[str] = ..., job: _Optional[str] = ...) -> None: ...

class OpenGroupReply(_message.Message):
    __slots__ = ("worker_name", "worker_pid", "lease_seconds", "data_path", "data_endpoint", "group_capability", "incarnation")
    WORKER_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DATA_PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    GROUP_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    worker_name: str
    worker_pid: int
    lease_seconds: float
    data_path: str
    data_endpoint: str
    group_capability: bytes
    incarnation: str
    def __init__(self, worker_name: _Optional[str] = ..., worker_pid: _Optional[int] = ..., lease_seconds: _Optional[float] = ..., data_path: _Optional[str] = ..., data_endpoint: _Optional[str] = ..., group_capability: _Optional[bytes] = ..., incarnation: _Optional[str] = ...) -> None: ...

class JoinGroupRequest(_message.Message):
    __slots__ = ("group_id", "endpoints")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    endpoints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_id: _Optional[str] = ..., endpoints: _Optional[_Iterable[str]] = ...) -> None: ...

class JoinGroupReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("lease_seconds", "incarnation")
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    lease_seconds: float
    incarnation: str
    def __init__(self, lease_seconds: _Optional[float] = ..., incarnation: _Optional[str] = ...) -> None: ...

class CloseGroupRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class CloseGroupReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EdgeTypeFanouts(_message.Message):
    __slots__ = ("edge_type", "fanouts")
    EDGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    FANOUTS_FIELD_NUMBER: _ClassVar[int]
    edge_type: EdgeType
    fanouts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, edge_type: _Optional[_Union[EdgeType, _Mapping]] = ..., fanouts: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingSpec(_message.Message):
    __slots__ = ("num_neighbors", "replace", "direction", "edge_type_fanouts", "weight_attr", "time_attr", "temporal_strategy", "disjoint", "replace_per_hop", "exclude_seed_edges", "reverse_edge_types", "temporal_strategy_per_hop")
    NUM_NEIGHBORS_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    EDGE_TYPE_FANOUTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_ATTR_FIELD_NUMBER: _ClassVar[int]
    TIME_ATTR_FIELD_NUMBER: _ClassVar[int]
    TEMPORAL_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    DISJOINT_FIELD_NUMBER: _ClassVar[int]
    REPLACE_PER_HOP_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_SEED_EDGES_FIELD_NUMBER: _ClassVar[int]
    REVERSE_EDGE_TYPES_FIELD_NUMBER: _ClassVar[int]
    TEMPORAL_STRATEGY_PER_HOP_FIELD_NUMBER: _ClassVar[int]
    num_neighbors: _containers.RepeatedScalarFieldContainer[int]
    replace: bool
    direction: str
    edge_type_fanouts: _containers.RepeatedCompositeFieldContainer[EdgeTypeFanouts]
    weight_attr: str
    time_attr: str
    temporal_strategy: str
    disjoint: bool
    replace_per_hop: _containers.RepeatedScalarFieldContainer[bool]
    exclude_seed_edges: bool
    reverse_edge_types: _containers.RepeatedCompositeFieldContainer[ReverseEdgeType]
    temporal_strategy_per_hop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, num_neighbors: _Optional[_Iterable[int]] = ..., replace: _Optional[bool] = ..., direction: _Optional[str] = ..., edge_type_fanouts: _Optional[_Iterable[_Union[EdgeTypeFanouts, _Mapping]]] = ..., weight_attr: _Optional[str] = ..., time_attr: _Optional[str] = ..., temporal_strategy: _Optional[str] = ..., disjoint: _Optional[bool] = ..., replace_per_hop: _Optional[_Iterable[bool]] = ..., exclude_seed_edges: _Optional[bool] = ..., reverse_edge_types: _Optional[_Iterable[_Union[ReverseEdgeType, _Mapping]]] = ..., temporal_strategy_per_hop: _Optional[_Iterable[str]] = ...) -> None: ...

class ReverseEdgeType(_message.Message):
    __slots__ = ("edge_type", "reverse")
    EDGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    REVERSE_FIELD_NUMBER: _ClassVar[int]
    edge_type: EdgeType
    reverse: EdgeType
    def __init__(self, edge_type: _Optional[_Union[EdgeType, _Mapping]] = ..., reverse: _Optional[_Union[EdgeType, _Mapping]] = ...) -> None: ...

class NodeIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class NegativeSampling(_message.Message):
    __slots__ = ("mode", "amount", "strict", "num_hard")
    MODE_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    NUM_HARD_FIELD_NUMBER: _ClassVar[int]
    mode: str
    amount: float
    strict: bool
    num_hard: int
    def __init__(self, mode: _Optional[str] = ..., amount: _Optional[float] = ..., strict: _Optional[bool] = ..., num_hard: _Optional[int] = ...) -> None: ...

class LinkSeeds(_message.Message):
    __slots__ = ("src", "dst", "float_label", "int_label", "neg", "time", "edge_type", "split")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    FLOAT_LABEL_FIELD_NUMBER: _ClassVar[int]
    INT_LABEL_FIELD_NUMBER: _ClassVar[int]
    NEG_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    EDGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    src: _containers.RepeatedScalarFieldContainer[int]
    dst: _containers.RepeatedScalarFieldContainer[int]
    float_label: _containers.RepeatedScalarFieldContainer[float]
    int_label: _containers.RepeatedScalarFieldContainer[int]
    neg: NegativeSampling
    time: _containers.RepeatedScalarFieldContainer[int]
    edge_type: _containers.RepeatedScalarFieldContainer[str]
    split: str
    def __init__(self, src: _Optional[_Iterable[int]] = ..., dst: _Optional[_Iterable[int]] = ..., float_label: _Optional[_Iterable[float]] = ..., int_label: _Optional[_Iterable[int]] = ..., neg: _Optional[_Union[NegativeSampling, _Mapping]] = ..., time: _Optional[_Iterable[int]] = ..., edge_type: _Optional[_Iterable[str]] = ..., split: _Optional[str] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("group_id", "spec", "split", "node_ids", "link", "batch_size", "shuffle", "drop_last", "seed", "rank", "world_size", "kind", "node_type", "feature_dtype", "input_time", "ordered", "feature_cache", "pack_partial", "open_key")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    DROP_LAST_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    FEATURE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    INPUT_TIME_FIELD_NUMBER: _ClassVar[int]
    ORDERED_FIELD_NUMBER: _ClassVar[int]
    FEATURE_CACHE_FIELD_NUMBER: _ClassVar[int]
    PACK_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    OPEN_KEY_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    spec: SamplingSpec
    split: str
    node_ids: NodeIds
    link: LinkSeeds
    batch_size: int
    shuffle: bool
    drop_last: bool
    seed: int
    rank: int
    world_size: int
    kind: str
    node_type: str
    feature_dtype: str
    input_time: _containers.RepeatedScalarFieldContainer[int]
    ordered: bool
    feature_cache: FeatureCache
    pack_partial: bool
    open_key: str
    def __init__(self, group_id: _Optional[str] = ..., spec: _Optional[_Union[SamplingSpec, _Mapping]] = ..., split: _Optional[str] = ..., node_ids: _Optional[_Union[NodeIds, _Mapping]] = ..., link: _Optional[_Union[LinkSeeds, _Mapping]] = ..., batch_size: _Optional[int] = ..., shuffle: _Optional[bool] = ..., drop_last: _Optional[bool] = ..., seed: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., kind: _Optional[str] = ..., node_type: _Optional[str] = ..., feature_dtype: _Optional[str] = ..., input_time: _Optional[_Iterable[int]] = ..., ordered: _Optional[bool] = ..., feature_cache: _Optional[_Union[FeatureCache, _Mapping]] = ..., pack_partial: _Optional[bool] = ..., open_key: _Optional[str] = ...) -> None: ...

class FeatureCache(_message.Message):
    __slots__ = ("node_type", "node_ids")
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    node_type: str
    node_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_type: _Optional[str] = ..., node_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class OpenSessionReply(_message.Message):
    __slots__ = ("session_id", "local_input_nodes", "session_secret")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_INPUT_NODES_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    local_input_nodes: int
    session_secret: bytes
    def __init__(self, session_id: _Optional[str] = ..., local_input_nodes: _Optional[int] = ..., session_secret: _Optional[bytes] = ...) -> None: ...

class StartEpochRequest(_message.Message):
    __slots__ = ("session_id", "epoch", "part_input_counts", "start_seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PART_INPUT_COUNTS_FIELD_NUMBER: _ClassVar[int]
    START_SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    epoch: int
    part_input_counts: _containers.RepeatedScalarFieldContainer[int]
    start_seq: int
    def __init__(self, session_id: _Optional[str] = ..., epoch: _Optional[int] = ..., part_input_counts: _Optional[_Iterable[int]] = ..., start_seq: _Optional[int] = ...) -> None: ...

class StartEpochReply(_message.Message):
    __slots__ = ("num_batches",)
    NUM_BATCHES_FIELD_NUMBER: _ClassVar[int]
    num_batches: int
    def __init__(self, num_batches: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionStats(_message.Message):
    __slots__ = ("session_id", "group_id", "kind", "epoch", "batches_produced", "batches_served", "bytes_served", "buffered_batches", "buffered_bytes")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BATCHES_PRODUCED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_SERVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SERVED_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_BYTES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    group_id: str
    kind: str
    epoch: int
    batches_produced: int
    batches_served: int
    bytes_served: int
    buffered_batches: int
    buffered_bytes: int
    def __init__(self, session_id: _Optional[str] = ..., group_id: _Optional[str] = ..., kind: _Optional[str] = ..., epoch: _Optional[int] = ..., batches_produced: _Optional[int] = ..., batches_served: _Optional[int] = ..., bytes_served: _Optional[int] = ..., buffered_batches: _Optional[int] = ..., buffered_bytes: _Optional[int] = ...) -> None: ...

class ServerStats(_message.Message):
    __slots__ = ("state", "part_id", "groups_open", "sessions_open", "sessions_opened_total", "sessions_reaped_total", "sessions", "uptime_seconds", "batches_served_total", "bytes_served_total", "buffered_batches", "buffered_bytes", "sessions_closed_total", "metrics_port", "sampler")
    STATE_FIELD_NUMBER: _ClassVar[int]
    PART_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_OPEN_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_OPEN_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_OPENED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_REAPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_SERVED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_SERVED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_CLOSED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    state: str
    part_id: int
    groups_open: int
    sessions_open: int
    sessions_opened_total: int
    sessions_reaped_total: int
    sessions: _containers.RepeatedCompositeFieldContainer[SessionStats]
    uptime_seconds: float
    batches_served_total: int
    bytes_served_total: int
    buffered_batches: int
    buffered_bytes: int
    sessions_closed_total: int
    metrics_port: int
    sampler: str
    def __init__(self, state: _Optional[str] = ..., part_id: _Optional[int] = ..., groups_open: _Optional[int] = ..., sessions_open: _Optional[int] = ..., sessions_opened_total: _Optional[int] = ..., sessions_reaped_total: _Optional[int] = ..., sessions: _Optional[_Iterable[_Union[SessionStats, _Mapping]]] = ..., uptime_seconds: _Optional[float] = ..., batches_served_total: _Optional[int] = ..., bytes_served_total: _Optional[int] = ..., buffered_batches: _Optional[int] = ..., buffered_bytes: _Optional[int] = ..., sessions_closed_total: _Optional[int] = ..., metrics_port: _Optional[int] = ..., sampler: _Optional[str] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class DrainReply(_message.Message):
    __slots__ = ("state", "grace_seconds")
    STATE_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    state: str
    grace_seconds: float
    def __init__(self, state: _Optional[str] = ..., grace_seconds: _Optional[float] = ...) -> None: ...
