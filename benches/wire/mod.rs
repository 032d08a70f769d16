//! The wire bytes both storm programs speak, written out here from torch-store-protocol.md §3
//! and §5 rather than taken from ferrodist's codec: the load generator and the floor server are
//! independent peers, so a wrong opcode in the crate cannot make them agree with it.

#![allow(dead_code)] // each program uses only the part it needs

pub const VALIDATE: u8 = 0;
pub const SET: u8 = 1;
pub const GET: u8 = 3;
pub const ADD: u8 = 4;
pub const WAIT: u8 = 6;
pub const PING: u8 = 13;
/// The number a client sends with VALIDATE.
pub const MAGIC: u32 = 0x3C85_F7CE;
/// The byte a server sends when a WAIT is released.
pub const STOP_WAITING: u8 = 0;
