//! The lease token ([`LeaseToken`]) and the allowance for clock drift that every
//! validity window subtracts ([`drift`]).

use std::fmt;
use std::time::Duration;

/// A 128-bit value identifying one lease. Only its holder knows it.
///
/// A backend mints the tokens of its leases ([`LockBackend::new_token`](super::LockBackend::new_token)): fully
/// random by default; the Redis backend puts its instance id in the high 64 bits
/// and 64 random bits in the low ones ([`for_instance`](Self::for_instance)), so
/// that whoever reads a lock key can tell which instance holds it, while the
/// token still cannot be guessed (2⁶⁴ values) by another process that would
/// release or renew it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(u128);

impl LeaseToken {
    /// A fresh token from the thread-local CSPRNG.
    pub fn random() -> Self {
        LeaseToken(rand::random())
    }

    /// A fresh token of the instance `instance`: the instance id in the high 64
    /// bits, 64 random bits (thread-local CSPRNG) in the low ones.
    ///
    /// ```
    /// use lockflight::backend::LeaseToken;
    ///
    /// let t = LeaseToken::for_instance(0x00c0_ffee);
    /// assert_eq!(t.instance(), 0x00c0_ffee);
    /// assert!(t.to_hex().starts_with("0000000000c0ffee"));
    /// assert_ne!(t, LeaseToken::for_instance(0x00c0_ffee));
    /// ```
    pub fn for_instance(instance: u64) -> Self {
        LeaseToken((u128::from(instance) << 64) | u128::from(rand::random::<u64>()))
    }

    /// The high 64 bits: the instance id of a token from
    /// [`for_instance`](Self::for_instance) (of a random token, a random number).
    pub fn instance(self) -> u64 {
        (self.0 >> 64) as u64
    }

    /// The token as 32 lowercase hex digits (what is stored at the lock key).
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// The token written as 32 hex digits (either case), as
    /// [`to_hex`](Self::to_hex) writes it; `None` for anything else.
    ///
    /// ```
    /// use lockflight::backend::LeaseToken;
    ///
    /// let t = LeaseToken::for_instance(7);
    /// assert_eq!(LeaseToken::from_hex(&t.to_hex()), Some(t));
    /// assert_eq!(LeaseToken::from_hex("00c0ffee"), None);
    /// ```
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(hex, 16).ok().map(LeaseToken)
    }
}

impl fmt::Debug for LeaseToken {
    /// Shows only the first 8 hex digits: enough to correlate logs, not to forge.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({:08x}…)", (self.0 >> 96) as u32)
    }
}

/// The safety margin subtracted from every validity window: 1 % of the TTL + 2 ms,
/// for clock drift between this process and the backend. Leases and the quorum
/// backend count validity the same way.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_hex_is_32_digits_and_debug_hides_most() {
        let t = LeaseToken::random();
        assert_eq!(t.to_hex().len(), 32);
        assert!(format!("{t:?}").len() < 30);
    }
}
