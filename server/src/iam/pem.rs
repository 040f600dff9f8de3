//! Checking an uploaded public key: PEM, RSA, exactly 4096 bits. Both PEM
//! forms are read (`BEGIN PUBLIC KEY`, SubjectPublicKeyInfo, as
//! `cryptography` and `openssl rsa -pubout` write it; and PKCS#1's
//! `BEGIN RSA PUBLIC KEY`); the key is stored in the first form, with the
//! SHA-256 of its DER encoding as fingerprint.

use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::pkcs8::{DecodePublicKey, EncodePublicKey, LineEnding};
use rsa::traits::PublicKeyParts;
use rsa::RsaPublicKey;
use sha2::{Digest, Sha256};

/// The only size accepted.
pub const RSA_BITS: usize = 4096;
pub const ALGORITHM: &str = "RSA_4096";

/// An accepted key: its PEM (SubjectPublicKeyInfo) and fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedKey {
    pub pem: String,
    pub fingerprint: String,
}

/// Reads `pem`; the error says what is wrong with it.
pub fn check_public_key(pem: &str) -> Result<CheckedKey, String> {
    let pem = pem.trim();
    if pem.contains("PRIVATE KEY-----") {
        return Err(
            "This is a private key: upload only the public key (keep the private one secret)."
                .into(),
        );
    }
    if !pem.starts_with("-----BEGIN ") {
        return Err(
            "The public key must be PEM text starting with `-----BEGIN PUBLIC KEY-----`.".into(),
        );
    }
    let key = RsaPublicKey::from_public_key_pem(pem)
        .or_else(|_| RsaPublicKey::from_pkcs1_pem(pem))
        .map_err(|_| "The PEM is not an RSA public key: only RSA 4096-bit keys are accepted.")?;
    let bits = key.n().bits();
    if bits != RSA_BITS {
        return Err(format!(
            "The RSA key has {bits} bits: only {RSA_BITS}-bit keys are accepted."
        ));
    }
    let der = key
        .to_public_key_der()
        .map_err(|e| format!("The key cannot be encoded: {e}"))?;
    let pem = key
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| format!("The key cannot be encoded: {e}"))?;
    Ok(CheckedKey {
        pem,
        fingerprint: hex::encode(Sha256::digest(der.as_bytes())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsa::pkcs1::EncodeRsaPublicKey;
    use rsa::RsaPrivateKey;

    #[test]
    fn only_rsa_4096_public_keys_pass() {
        let mut rng = rsa::rand_core::OsRng;
        let small = RsaPrivateKey::new(&mut rng, 1024).unwrap();
        let public = small.to_public_key();
        let spki = public.to_public_key_pem(LineEnding::LF).unwrap();
        let err = check_public_key(&spki).unwrap_err();
        assert!(err.contains("1024 bits"), "{err}");
        assert!(check_public_key("hello").unwrap_err().contains("PEM"));
        assert!(
            check_public_key("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----")
                .unwrap_err()
                .contains("private key")
        );
        assert!(check_public_key(
            "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----"
        )
        .unwrap_err()
        .contains("not an RSA public key"));

        let big = RsaPrivateKey::new(&mut rng, 4096).unwrap().to_public_key();
        let spki = big.to_public_key_pem(LineEnding::LF).unwrap();
        let pkcs1 = big.to_pkcs1_pem(LineEnding::LF).unwrap();
        let a = check_public_key(&spki).unwrap();
        let b = check_public_key(&pkcs1).unwrap();
        assert_eq!(a, b, "both PEM forms give the same stored key");
        assert_eq!(a.pem.trim(), spki.trim());
        assert_eq!(a.fingerprint.len(), 64);
    }
}
