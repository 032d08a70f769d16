//! FullyShardedDataParallel planning from metadata only: nothing here touches a tensor.
//!
//! * [`layout`]: how torch flattens a module's parameters into one flat parameter (alignment
//!   and world-size padding) and which slice of it each rank holds, with the per-parameter shard
//!   info torch keeps (`_ShardParamInfo`).

pub mod layout;
