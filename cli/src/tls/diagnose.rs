//! Why a `rediss://` connection failed, in the operator's terms: which file or
//! name is at fault. Run after the redis client's connection failed (the error
//! it returns says what rustls refused, not which of the command's options
//! caused it): a second, bounded handshake with rustls directly, with the same
//! trust anchors and client certificate, that records what the server
//! presented and what it asked for.
//!
//! The faults it names, in the order it checks them:
//!
//! 1. the server's certificate: not signed by a CA of `--tls-ca-file` (or of the
//!    system's roots without it), the file holding no CA at all, expired or not
//!    yet valid, X.509 v1;
//! 2. the server's name: the URL's host is not among the certificate's
//!    subjectAltName entries (checked even when the chain is refused too);
//! 3. the client certificate, once the server's was accepted: the server asks
//!    for one and none was given, or refuses the one given (the CAs it accepts
//!    client certificates from, when it lists them, against the certificate's
//!    issuer).
//!
//! The probe sends `PING` only after the server's certificate was accepted, and
//! no credentials. The client certificate's own faults (unreadable, not PEM,
//! version 1, a key that does not match) are found at startup, before any
//! connection (`super::init`).

use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::sign::CertifiedKey;
use rustls::{
    AlertDescription, CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct,
    Error, RootCertStore, SignatureScheme,
};

use super::der::{CertFacts, name_of, with_header};

/// How long the probe waits to connect, and for each read or write.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What the probe knows of the command's TLS options.
pub(crate) struct Trust<'a> {
    /// `--tls-ca-file`'s path and its certificates (`None`: the system's roots).
    pub(crate) ca: Option<(&'a str, &'a RootCertStore, &'a [CertFacts])>,
    /// `--tls-cert-file`'s path, its facts and the certified key.
    pub(crate) client: Option<(&'a str, &'a CertFacts, &'a Arc<CertifiedKey>)>,
}

/// The faults of a TLS connection to `host:port`, each a sentence naming the
/// option or name at fault; empty when the probe finds TLS working (the
/// connection failed for another reason) or cannot connect at all.
pub(crate) fn faults(host: &str, port: u16, trust: &Trust<'_>) -> Vec<String> {
    let Ok(server_name) = ServerName::try_from(host.to_owned()) else {
        return Vec::new();
    };
    let Some(provider) = CryptoProvider::get_default().cloned() else {
        return Vec::new();
    };
    let roots = match trust.ca {
        Some((_, store, _)) => store.clone(),
        None => system_roots(),
    };
    let witness = Arc::new(Witness {
        chain: WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .ok(),
        provider: provider.clone(),
        seen: Mutex::new(None),
    });
    let presenter = Arc::new(Presenter {
        key: trust.client.map(|(_, _, key)| Arc::clone(key)),
        asked: Mutex::new(None),
    });
    let Ok(config) = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map(|b| {
            b.dangerous()
                .with_custom_certificate_verifier(witness.clone())
                .with_client_cert_resolver(presenter.clone())
        })
    else {
        return Vec::new();
    };
    let outcome = exchange(host, port, config, server_name.clone());
    let seen = witness
        .seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let asked = presenter
        .asked
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();

    let mut found = Vec::new();
    if let Some(Seen {
        end_entity,
        verdict,
    }) = seen
    {
        let facts = CertFacts::read(&end_entity);
        if let Err(error) = verdict {
            found.extend(server_certificate(&error, facts.as_ref(), trust));
        }
        if let Some(fault) = server_name_fault(
            &CertificateDer::from(end_entity.as_slice()),
            &server_name,
            host,
        ) {
            found.push(fault);
        }
        if !found.is_empty() {
            return found;
        }
    }
    match outcome {
        Outcome::Answered => {}
        Outcome::Unreachable => {}
        Outcome::Ended(error) => found.push(client_certificate(error, asked, trust)),
        Outcome::Failed(error) => found.push(format!("the TLS handshake failed: {error}")),
    }
    found
}

/// The system's trust anchors, as the redis client loads them without
/// `--tls-ca-file`.
fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    roots
}

/// How the probe's exchange ended.
enum Outcome {
    /// The server answered `PING`: TLS works.
    Answered,
    /// No TCP connection.
    Unreachable,
    /// The handshake failed on the client's side (e.g. the server's certificate
    /// was refused).
    Failed(Error),
    /// The handshake completed on the client's side, then the server ended the
    /// session: with the alert it sent, if any.
    Ended(Option<AlertDescription>),
}

/// Connects, completes the handshake, sends `PING` and reads the answer.
fn exchange(host: &str, port: u16, config: ClientConfig, name: ServerName<'static>) -> Outcome {
    let Some(mut socket) = (host, port).to_socket_addrs().ok().and_then(|addrs| {
        addrs
            .into_iter()
            .find_map(|a| TcpStream::connect_timeout(&a, PROBE_TIMEOUT).ok())
    }) else {
        return Outcome::Unreachable;
    };
    let _ = socket.set_read_timeout(Some(PROBE_TIMEOUT));
    let _ = socket.set_write_timeout(Some(PROBE_TIMEOUT));
    let Ok(mut conn) = ClientConnection::new(Arc::new(config), name) else {
        return Outcome::Unreachable;
    };
    let rustls_error = |e: &std::io::Error| {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<Error>())
            .cloned()
    };
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut socket) {
            return match rustls_error(&e) {
                Some(Error::AlertReceived(alert)) => Outcome::Ended(Some(alert)),
                Some(error) => Outcome::Failed(error),
                None => Outcome::Ended(None),
            };
        }
    }
    let mut tls = rustls::Stream::new(&mut conn, &mut socket);
    let mut reply = [0u8; 64];
    let sent = tls.write_all(b"PING\r\n").and_then(|()| tls.flush());
    match sent.and_then(|()| tls.read(&mut reply)) {
        Ok(n) if n > 0 => Outcome::Answered,
        Ok(_) => Outcome::Ended(None),
        Err(e) => match rustls_error(&e) {
            Some(Error::AlertReceived(alert)) => Outcome::Ended(Some(alert)),
            _ if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                // Neither an answer nor an alert: not TLS's doing.
                Outcome::Answered
            }
            _ => Outcome::Ended(None),
        },
    }
}

/// What is wrong with the server's certificate, given rustls's verdict.
fn server_certificate(error: &Error, facts: Option<&CertFacts>, trust: &Trust<'_>) -> Vec<String> {
    let described = facts.map_or_else(
        || "the server's certificate".to_owned(),
        |f| {
            format!(
                "the server's certificate ({}, issued by {})",
                f.subject, f.issuer
            )
        },
    );
    let Error::InvalidCertificate(error) = error else {
        return vec![format!("{described} is refused: {error}")];
    };
    match error {
        CertificateError::UnknownIssuer => vec![unknown_issuer(&described, facts, trust)],
        // Reported from the name check, with the names it holds.
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            Vec::new()
        }
        CertificateError::Expired
        | CertificateError::ExpiredContext { .. }
        | CertificateError::NotValidYet
        | CertificateError::NotValidYetContext { .. } => vec![format!(
            "{described} is outside its validity period ({error}): renew it, or check this machine's clock"
        )],
        _ if facts.is_some_and(|f| f.version < 3) => vec![format!(
            "{described} is an X.509 v{}; rustls (lockflight's TLS) takes only v3 certificates ({error}): reissue it with extensions (subjectAltName)",
            facts.map_or(1, |f| f.version)
        )],
        _ => vec![format!("{described} is refused: {error}")],
    }
}

/// The server's certificate chains to no trust anchor: which CA file is wrong,
/// and how.
fn unknown_issuer(described: &str, facts: Option<&CertFacts>, trust: &Trust<'_>) -> String {
    let Some((path, _, cas)) = trust.ca else {
        return format!(
            "{described} is not signed by a CA this machine trusts: give the CA that issued it with --tls-ca-file"
        );
    };
    let held = cas
        .iter()
        .map(|c| c.subject.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    if !cas.iter().any(|c| c.is_ca) {
        return format!(
            "{described} is not signed by --tls-ca-file {path}, which holds no CA certificate ({held}: basicConstraints CA:FALSE or none, as a server's or client's own certificate): give the certificate of the CA that issued the server's"
        );
    }
    let same_name = facts.is_some_and(|f| cas.iter().any(|c| c.subject_der == f.issuer_der));
    if same_name {
        format!(
            "{described} is not signed by the CA of --tls-ca-file {path}: it holds a CA of that name but with another key (a CA re-created under the same name?); give the CA that issued the server's certificate"
        )
    } else {
        format!(
            "{described} is not signed by a CA of --tls-ca-file {path} (it holds {held}): give the CA that issued the server's certificate"
        )
    }
}

/// The URL's host is not a name of the certificate.
fn server_name_fault(
    end_entity: &CertificateDer<'_>,
    name: &ServerName<'_>,
    host: &str,
) -> Option<String> {
    let parsed = ParsedCertificate::try_from(end_entity).ok()?;
    match rustls::client::verify_server_name(&parsed, name) {
        Ok(()) => None,
        Err(Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            presented,
            ..
        })) => Some(format!(
            "the server's certificate is not valid for {host}, the URL's host: its subjectAltName names {}; connect by one of those names, or reissue the certificate with {host} in its subjectAltName",
            if presented.is_empty() {
                "nothing".to_owned()
            } else {
                presented.join(", ")
            }
        )),
        Err(e) => Some(format!(
            "the server's certificate is not valid for {host}, the URL's host ({e}): reissue it with {host} in its subjectAltName"
        )),
    }
}

/// The server ended the session after the handshake (with `alert`): a missing or
/// refused client certificate.
fn client_certificate(
    alert: Option<AlertDescription>,
    asked: Option<Vec<Vec<u8>>>,
    trust: &Trust<'_>,
) -> String {
    let alert_text = alert.map_or_else(
        || "it closed the connection".to_owned(),
        |a| format!("TLS alert {a:?}"),
    );
    let Some((path, facts, _)) = trust.client else {
        return if asked.is_some() || alert == Some(AlertDescription::CertificateRequired) {
            format!(
                "the server requires a client certificate ({alert_text}): give it with --tls-cert-file and --tls-key-file"
            )
        } else {
            format!("the server ended the TLS session after the handshake ({alert_text})")
        };
    };
    let mut fault = format!(
        "the server refused the client certificate of --tls-cert-file {path} ({alert_text})"
    );
    let accepted: Vec<Vec<u8>> = asked
        .unwrap_or_default()
        .iter()
        .map(|hint| with_header(hint))
        .collect();
    if !accepted.is_empty() && !accepted.contains(&facts.issuer_der) {
        let names = accepted
            .iter()
            .map(|n| name_of(n))
            .collect::<Vec<_>>()
            .join("; ");
        fault.push_str(&format!(
            ": it takes client certificates issued by {names}, and this one ({}) is issued by {}",
            facts.subject, facts.issuer
        ));
    } else {
        fault.push_str(
            ": it must be issued by a CA of the server's tls-ca-cert-file, valid now, for clientAuth",
        );
    }
    fault
}

/// Checks the server's certificate as the redis client does, and records it with
/// the verdict.
#[derive(Debug)]
struct Witness {
    /// `None` without any trust anchor: every chain is refused.
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
    seen: Mutex<Option<Seen>>,
}

/// The server's certificate (DER) and rustls's verdict on it.
#[derive(Debug)]
struct Seen {
    end_entity: Vec<u8>,
    verdict: Result<(), Error>,
}

impl ServerCertVerifier for Witness {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let verdict = match &self.chain {
            Some(chain) => chain
                .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
                .map(drop),
            None => Err(CertificateError::UnknownIssuer.into()),
        };
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(Seen {
            end_entity: end_entity.to_vec(),
            verdict: verdict.clone(),
        });
        verdict.map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Presents the client certificate (if any) and records whether the server asked
/// for one, and from which CAs.
#[derive(Debug)]
struct Presenter {
    key: Option<Arc<CertifiedKey>>,
    asked: Mutex<Option<Vec<Vec<u8>>>>,
}

impl ResolvesClientCert for Presenter {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        *self.asked.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(root_hint_subjects.iter().map(|h| h.to_vec()).collect());
        self.key.clone()
    }

    fn has_certs(&self) -> bool {
        true
    }
}
