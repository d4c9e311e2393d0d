//! TLS of every connection the command opens: the CA that signed the servers'
//! certificates and the client certificate (`--tls-ca-file`, `--tls-cert-file`,
//! `--tls-key-file`). They are read and checked once, at startup ([`init`]), and
//! then applied to every `rediss://` URL the command connects to: the ones given
//! on the command line and the ones derived from them (a cluster's primaries
//! keep the scheme of the node given). A `redis://` URL stays plain TCP.

use std::path::PathBuf;
#[cfg(feature = "tls")]
use std::{path::Path, sync::OnceLock};

/// The TLS files of the command line.
#[derive(Debug, Default)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

impl TlsFiles {
    /// Whether any TLS file was given.
    pub(crate) fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }
}

/// The certificates read by [`init`]; unset without TLS files.
#[cfg(feature = "tls")]
static CERTS: OnceLock<redis::TlsCertificates> = OnceLock::new();

/// Whether `url` asks for TLS.
pub(crate) fn is_tls_url(url: &str) -> bool {
    url.starts_with("rediss://")
}

/// Installs the process's TLS crypto provider (ring) and reads `files`: each
/// must be readable and hold PEM (certificates; the key, a private key); the
/// client certificate and its key come together. On success the certificates
/// apply to every `rediss://` connection of the process; an error names the
/// option and the file (a usage error: exit 2).
#[cfg(feature = "tls")]
pub(crate) fn init(files: &TlsFiles) -> Result<(), String> {
    // Keep a provider the process may already have installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if !files.any() {
        return Ok(());
    }
    let root_cert = match &files.ca {
        Some(path) => {
            let pem = read_pem(path, "--tls-ca-file", "CERTIFICATE")?;
            check(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            })
            .map_err(|e| format!("--tls-ca-file {}: {e}", path.display()))?;
            Some(pem)
        }
        None => None,
    };
    let client_tls = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => {
            let client = redis::ClientTlsConfig {
                client_cert: read_pem(cert, "--tls-cert-file", "CERTIFICATE")?,
                client_key: read_pem(key, "--tls-key-file", "PRIVATE KEY")?,
            };
            check(redis::TlsCertificates {
                client_tls: Some(client.clone()),
                root_cert: None,
            })
            .map_err(|e| {
                format!(
                    "--tls-cert-file {} / --tls-key-file {}: {e}",
                    cert.display(),
                    key.display()
                )
            })?;
            Some(client)
        }
        (None, None) => None,
        _ => {
            return Err(
                "--tls-cert-file and --tls-key-file go together (the client certificate and its private key)"
                    .to_owned(),
            );
        }
    };
    let _ = CERTS.set(redis::TlsCertificates {
        client_tls,
        root_cert,
    });
    Ok(())
}

/// Without the `tls` feature: TLS files are refused.
#[cfg(not(feature = "tls"))]
pub(crate) fn init(files: &TlsFiles) -> Result<(), String> {
    if files.any() {
        return Err(
            "this lockflight was built without TLS (the `tls` feature of lockflight-cli)"
                .to_owned(),
        );
    }
    Ok(())
}

/// `path`'s bytes, if it is readable and holds a PEM block of `label` (a
/// `-----BEGIN … <label>-----` line).
#[cfg(feature = "tls")]
fn read_pem(path: &Path, option: &str, label: &str) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path)
        .map_err(|e| format!("{option} {}: cannot read it: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&pem);
    let has_block = text
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.trim_end().ends_with(&format!("{label}-----")));
    if !has_block {
        return Err(format!(
            "{option} {}: no PEM {label} in it (a \"-----BEGIN … {label}-----\" block)",
            path.display()
        ));
    }
    Ok(pem)
}

/// Parses `certs` as the redis crate will (a client of a placeholder URL).
#[cfg(feature = "tls")]
fn check(certs: redis::TlsCertificates) -> redis::RedisResult<()> {
    redis::Client::build_with_tls("rediss://127.0.0.1/", certs).map(drop)
}

/// A client for `url`: with the certificates of [`init`] if `url` is
/// `rediss://`.
pub(crate) fn client(url: &str) -> redis::RedisResult<redis::Client> {
    #[cfg(feature = "tls")]
    if let Some(certs) = CERTS.get()
        && is_tls_url(url)
    {
        return redis::Client::build_with_tls(url, certs.clone());
    }
    redis::Client::open(url)
}

/// A cluster client builder for the node `url`: with the certificates of
/// [`init`] if `url` is `rediss://`.
pub(crate) fn cluster_builder(url: &str) -> redis::cluster::ClusterClientBuilder {
    let builder = redis::cluster::ClusterClientBuilder::new(vec![url]);
    #[cfg(feature = "tls")]
    if let Some(certs) = CERTS.get()
        && is_tls_url(url)
    {
        return builder.certs(certs.clone());
    }
    builder
}

/// What to do about a failed connection, if TLS is the likely cause: appended
/// to the error message.
pub(crate) fn hint(error: &redis::RedisError) -> &'static str {
    let text = error.to_string();
    if text.contains("CertificateRequired") || text.contains("certificate required") {
        " (the server asks for a client certificate: give it with --tls-cert-file and --tls-key-file)"
    } else if text.contains("certificate") || text.contains("UnknownIssuer") {
        " (the server's certificate is not trusted: give the CA that signed it with --tls-ca-file)"
    } else {
        ""
    }
}
