//! TLS of every connection the command opens: the CA that signed the servers'
//! certificates and the client certificate (`--tls-ca-file`, `--tls-cert-file`,
//! `--tls-key-file`). They are read and checked once, at startup ([`init`]), and
//! then applied to every `rediss://` URL the command connects to: the ones given
//! on the command line and the ones derived from them (a cluster's primaries
//! keep the scheme of the node given). A `redis://` URL stays plain TCP, unless
//! `--tls` made it `rediss://` ([`with_tls`]).
//!
//! A fault is named with the option and file at fault: what can be checked
//! alone (a file unreadable or not PEM, a client certificate of X.509 v1, a key
//! that is not the certificate's) at startup, as a usage error; what needs the
//! server (a CA that did not sign its certificate, a host name its certificate
//! does not hold, a client certificate it refuses) when a connection fails
//! ([`explain`], `diagnose`).

#[cfg(feature = "tls")]
mod der;
#[cfg(feature = "tls")]
mod diagnose;

use std::path::PathBuf;
#[cfg(feature = "tls")]
use std::{path::Path, sync::Arc, sync::OnceLock};

#[cfg(feature = "tls")]
use rustls::pki_types::pem::PemObject as _;
#[cfg(feature = "tls")]
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
#[cfg(feature = "tls")]
use rustls::sign::CertifiedKey;
#[cfg(feature = "tls")]
use rustls::{CertificateError, Error as RustlsError, InconsistentKeys, RootCertStore};

#[cfg(feature = "tls")]
use der::CertFacts;

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

/// What [`init`] read and checked: the certificates as the redis client takes
/// them, and as the diagnosis of a failed connection ([`explain`]) names them.
#[cfg(feature = "tls")]
struct Setup {
    /// For every `rediss://` client; `None` without TLS files.
    certs: Option<redis::TlsCertificates>,
    ca: Option<CaFile>,
    client: Option<ClientCert>,
}

/// `--tls-ca-file`, read.
#[cfg(feature = "tls")]
struct CaFile {
    /// The path, as given.
    path: String,
    pem: Vec<u8>,
    /// Its certificates as trust anchors.
    store: RootCertStore,
    /// Its certificates' facts, in the file's order.
    facts: Vec<CertFacts>,
}

/// `--tls-cert-file` and `--tls-key-file`, read and checked.
#[cfg(feature = "tls")]
struct ClientCert {
    /// The certificate's path, as given.
    path: String,
    /// As the redis client takes them.
    tls: redis::ClientTlsConfig,
    /// The facts of the certificate (the first of the file).
    facts: CertFacts,
    /// As rustls takes them.
    key: Arc<CertifiedKey>,
}

#[cfg(feature = "tls")]
static SETUP: OnceLock<Setup> = OnceLock::new();

/// Whether `url` asks for TLS.
pub(crate) fn is_tls_url(url: &str) -> bool {
    url.starts_with("rediss://")
}

/// `url` with TLS (`--tls`): a `redis://` URL becomes `rediss://`; others stay.
pub(crate) fn with_tls(url: &str) -> String {
    match url.strip_prefix("redis://") {
        Some(rest) => format!("rediss://{rest}"),
        None => url.to_owned(),
    }
}

/// Installs the process's TLS crypto provider (ring) and reads `files`: each
/// must be readable and hold PEM; the CA file, certificates usable as trust
/// anchors; the client certificate, an X.509 v3 certificate, and the key, the
/// private key of that certificate (they come together). On success the
/// certificates apply to every `rediss://` connection of the process; an error
/// names the option, the file and what is wrong with it (a usage error: exit 2).
#[cfg(feature = "tls")]
pub(crate) fn init(files: &TlsFiles) -> Result<(), String> {
    // Keep a provider the process may already have installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = files.ca.as_deref().map(read_ca).transpose()?;
    let client = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => Some(read_client(cert, key)?),
        (None, None) => None,
        _ => {
            return Err(
                "--tls-cert-file and --tls-key-file go together (the client certificate and its private key)"
                    .to_owned(),
            );
        }
    };
    let certs = files.any().then(|| redis::TlsCertificates {
        client_tls: client.as_ref().map(|c| c.tls.clone()),
        root_cert: ca.as_ref().map(|c| c.pem.clone()),
    });
    if let Some(certs) = &certs {
        // Parsed as the redis crate will (a client of a placeholder URL).
        redis::Client::build_with_tls("rediss://127.0.0.1/", certs.clone())
            .map_err(|e| format!("the TLS files: {e}"))?;
    }
    let _ = SETUP.set(Setup { certs, ca, client });
    Ok(())
}

/// `--tls-ca-file`: PEM certificates, each usable as a trust anchor.
#[cfg(feature = "tls")]
fn read_ca(path: &Path) -> Result<CaFile, String> {
    let option = "--tls-ca-file";
    let pem = read_pem(path, option, "CERTIFICATE")?;
    let shown = path.display().to_string();
    let mut store = RootCertStore::empty();
    let mut facts = Vec::new();
    for (n, cert) in CertificateDer::pem_slice_iter(&pem).enumerate() {
        let cert = cert.map_err(|e| format!("{option} {shown}: certificate {}: {e}", n + 1))?;
        facts.extend(CertFacts::read(&cert));
        store.add(cert).map_err(|e| {
            format!(
                "{option} {shown}: certificate {} is not usable as a trust anchor: {e}",
                n + 1
            )
        })?;
    }
    Ok(CaFile {
        path: shown,
        pem,
        store,
        facts,
    })
}

/// `--tls-cert-file` and `--tls-key-file`: the client certificate as the redis
/// client takes it, and as rustls checks it (an X.509 v3 certificate whose public
/// key is the key's).
#[cfg(feature = "tls")]
fn read_client(cert: &Path, key: &Path) -> Result<ClientCert, String> {
    let cert_pem = read_pem(cert, "--tls-cert-file", "CERTIFICATE")?;
    let key_pem = read_pem(key, "--tls-key-file", "PRIVATE KEY")?;
    let (cert_shown, key_shown) = (cert.display().to_string(), key.display().to_string());
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--tls-cert-file {cert_shown}: {e}"))?;
    let facts = chain
        .first()
        .and_then(|c| CertFacts::read(c))
        .ok_or_else(|| format!("--tls-cert-file {cert_shown}: not an X.509 certificate"))?;
    if facts.version < 3 {
        return Err(format!(
            "--tls-cert-file {cert_shown}: an X.509 v{} certificate ({}); rustls (lockflight's TLS) takes only v3 client certificates (UnsupportedCertVersion): reissue it with extensions (e.g. `openssl x509 -req … -extfile` with extendedKeyUsage=clientAuth)",
            facts.version, facts.subject
        ));
    }
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        format!("--tls-key-file {key_shown}: no private key rustls can read (PKCS#8, PKCS#1 or SEC1 PEM): {e}")
    })?;
    let provider =
        rustls::crypto::CryptoProvider::get_default().ok_or("no TLS crypto provider installed")?;
    let certified = CertifiedKey::from_der(chain, private, provider).map_err(|e| match e {
        RustlsError::InconsistentKeys(InconsistentKeys::KeyMismatch) => format!(
            "--tls-key-file {key_shown} is not the key of --tls-cert-file {cert_shown} ({}): their public keys differ; give the key the certificate was issued for",
            facts.subject
        ),
        RustlsError::InvalidCertificate(CertificateError::BadEncoding) => {
            format!("--tls-cert-file {cert_shown}: not a certificate rustls can read")
        }
        RustlsError::InvalidCertificate(e) => {
            format!("--tls-cert-file {cert_shown}: rustls refuses it: {e}")
        }
        e => format!("--tls-key-file {key_shown}: rustls cannot use it: {e}"),
    })?;
    let tls = redis::ClientTlsConfig {
        client_cert: cert_pem,
        client_key: key_pem,
    };
    Ok(ClientCert {
        path: cert_shown,
        tls,
        facts,
        key: Arc::new(certified),
    })
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

/// A client for `url`: with the certificates of [`init`] if `url` is
/// `rediss://`.
pub(crate) fn client(url: &str) -> redis::RedisResult<redis::Client> {
    #[cfg(feature = "tls")]
    if let Some(certs) = SETUP.get().and_then(|s| s.certs.as_ref())
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
    if let Some(certs) = SETUP.get().and_then(|s| s.certs.as_ref())
        && is_tls_url(url)
    {
        return builder.certs(certs.clone());
    }
    builder
}

/// Why the connection to `url` failed, if TLS is the cause: the file or name at
/// fault (`diagnose`), as ` (…)` to append to the error message; empty for a
/// plain URL, a refused or timed-out connection, or when TLS works.
#[cfg(feature = "tls")]
pub(crate) async fn explain(url: &str, error: &redis::RedisError) -> String {
    if !is_tls_url(url) || error.is_connection_refusal() || error.is_timeout() {
        return String::new();
    }
    let Ok(info) = redis::IntoConnectionInfo::into_connection_info(url) else {
        return String::new();
    };
    let redis::ConnectionAddr::TcpTls {
        host,
        port,
        insecure: false,
        ..
    } = info.addr().clone()
    else {
        return String::new();
    };
    let faults = tokio::task::spawn_blocking(move || {
        let setup = SETUP.get();
        let trust = diagnose::Trust {
            ca: setup
                .and_then(|s| s.ca.as_ref())
                .map(|c| (c.path.as_str(), &c.store, c.facts.as_slice())),
            client: setup
                .and_then(|s| s.client.as_ref())
                .map(|c| (c.path.as_str(), &c.facts, &c.key)),
        };
        diagnose::faults(&host, port, &trust)
    })
    .await
    .unwrap_or_default();
    if faults.is_empty() {
        String::new()
    } else {
        format!(" ({})", faults.join("; "))
    }
}

/// Without the `tls` feature there is no TLS to explain.
#[cfg(not(feature = "tls"))]
pub(crate) async fn explain(_url: &str, _error: &redis::RedisError) -> String {
    String::new()
}
