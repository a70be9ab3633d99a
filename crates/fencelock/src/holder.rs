//! The two faces of a lock holder: its token, a secret, and its holder id,
//! public.
//!
//! The **token** (122 random bits: a UUID v4, [`new_token`]; `Lease::token`) is a bearer secret:
//! whoever knows it can release or extend the lock and write as its holder.
//! Keep it in the process that holds the lease (the CLI passes it only to
//! the command it runs, as `FENCELOCK_TOKEN`).
//!
//! The **holder id** ([`holder_id`]) is derived from the token and safe to
//! show: `status`, `top`, `read`, logs, and the fenced resources, which
//! store it next to the fence. Knowing an id does not let anyone act as
//! that holder: a fenced write presents the token, and the resource derives
//! the id from it.

/// The public id of the holder with `token`: the first 16 hex digits of
/// SHA-1(token), as the fenced resources store it (the Redis hash's script
/// computes the same with `redis.sha1hex`).
///
/// ```
/// let id = fencelock::holder_id("03df6e4c-6b7c-4e5a-9a8f-0c6b2d6f9e11");
/// assert_eq!(id.len(), 16);
/// assert_eq!(id, fencelock::holder_id("03df6e4c-6b7c-4e5a-9a8f-0c6b2d6f9e11"));
/// ```
pub fn holder_id(token: &str) -> String {
    let mut hex = sha1_smol::Sha1::from(token).digest().to_string();
    hex.truncate(16);
    hex
}

/// A fresh holder token: 122 random bits, hyphenated like the guide's
/// `str(uuid.uuid4())`.
pub(crate) fn new_token() -> String {
    // Encoded directly: `to_string` goes through the formatting machinery,
    // a measurable share of an acquire's own work.
    let mut buf = uuid::Uuid::encode_buffer();
    uuid::Uuid::new_v4()
        .hyphenated()
        .encode_lower(&mut buf)
        .to_owned()
}

/// The holder a seal records at a resource (a revoke's mark, see
/// [`Sealable`](crate::Sealable)). Holder ids are hexadecimal, so no holder
/// ever equals it.
pub const REVOKED_HOLDER: &str = "revoked";

#[cfg(test)]
mod tests {
    use super::holder_id;

    #[test]
    fn ids_are_the_first_16_hex_digits_of_sha1() {
        // sha1("abc") = a9993e364706816aba3e25717850c26c9cd0d89d
        assert_eq!(holder_id("abc"), "a9993e364706816a");
    }
}
