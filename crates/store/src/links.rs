//! Signed, time-limited download links: HMAC-SHA256 over the file id and the
//! expiry time, keyed by a server secret kept in the store's settings.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::Store;

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8], file_id: &str, expires_at: i64) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(file_id.as_bytes());
    mac.update(b"\n");
    mac.update(expires_at.to_string().as_bytes());
    mac
}

impl Store {
    /// The signature of a link to `file_id` valid until `expires_at`.
    pub fn sign_link(&self, file_id: &str, expires_at: i64) -> String {
        hex::encode(
            mac(self.link_secret(), file_id, expires_at)
                .finalize()
                .into_bytes(),
        )
    }

    /// Whether `signature` is this server's for `file_id` and `expires_at`,
    /// and `expires_at` has not passed (compared in constant time).
    pub fn verify_link(&self, file_id: &str, expires_at: i64, signature: &str) -> bool {
        if expires_at < crate::ids::now() {
            return false;
        }
        let Ok(bytes) = hex::decode(signature) else {
            return false;
        };
        mac(self.link_secret(), file_id, expires_at)
            .verify_slice(&bytes)
            .is_ok()
    }
}
