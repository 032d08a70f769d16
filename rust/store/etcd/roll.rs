//! Rolls ([`crate::store::Roll`]) on etcd: a key per member, counted in the same
//! transaction that writes it.
//!
//! The default roll (an append to one shared key and an add to another) would be two
//! compare-and-swap transactions per member here, with every member contending for the same
//! two keys: each lost race costs a raft commit and a retry, O(n²) commits for n members (a
//! 1024-rank rendezvous did not finish within 120 s). Here a member puts a key of its own, which
//! races with nobody, and the same transaction counts the roll's keys. etcd applies
//! transactions one at a time, so members see the counts 1..n in commit order and the member
//! whose key completes the roll sees n. A put retried after a lost reply finds its key already
//! there and counts the same or more, so a retry never hides the last member (it can make two
//! members see n; the rendezvous then writes its `done` key twice, which is harmless).
//!
//! Keys: `<prefix>:roll/<length of the roll's name>/<roll>/<member>` ([`super::Layout::roll`]).
//! The length keeps one roll's range from covering another's (a roll `a`'s range would otherwise
//! hold roll `a/b`'s keys).

use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};

use super::EtcdStore;
use crate::error::Result;
use crate::store::Roll;

impl EtcdStore {
    /// The etcd key range of roll `roll`: every member key starts with it.
    fn roll_range(&self, roll: &str) -> Vec<u8> {
        self.layout.roll(roll)
    }
}

impl Roll for EtcdStore {
    /// Puts `member`'s key in roll `roll` and counts the roll's keys, in one transaction.
    fn enroll(&self, roll: &str, member: usize) -> Result<usize> {
        let range = self.roll_range(roll);
        let mut key = range.clone();
        key.extend_from_slice(member.to_string().as_bytes());
        self.call("enroll", |mut kv| {
            let count = GetOptions::new().with_prefix().with_count_only();
            let txn = Txn::new().and_then([
                TxnOp::put(key.clone(), Vec::new(), None),
                TxnOp::get(range.clone(), Some(count)),
            ]);
            async move {
                let response = kv.txn(txn).await?;
                let counted = response.op_responses().into_iter().find_map(|r| match r {
                    TxnOpResponse::Get(get) => Some(get.count()),
                    _ => None,
                });
                Ok(Ok(usize::try_from(counted.unwrap_or(0)).unwrap_or(0)))
            }
        })
    }

    /// The members of roll `roll`: one range read of its keys (names only).
    fn enrolled(&self, roll: &str) -> Result<Vec<usize>> {
        let range = self.roll_range(roll);
        let keys = self.call("enrolled", |kv| super::keys_under(kv, range.clone()))?;
        Ok(keys
            .iter()
            .filter_map(|k| k.strip_prefix(range.as_slice()))
            .filter_map(|member| std::str::from_utf8(member).ok()?.parse().ok())
            .collect())
    }
}
