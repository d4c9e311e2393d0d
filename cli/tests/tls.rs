//! The `lockflight` command on a real TLS redis-server (`--tls-port`): a private
//! CA, a server certificate for 127.0.0.1 and a client certificate, made with
//! `openssl` for each test. `doctor` connects with `--tls-ca-file` and refuses the
//! server's certificate without it; `inspect`, `list` and `release --force`
//! operate a key held by a locker connected over TLS; a server that requires client
//! certificates (`tls-auth-clients yes`) accepts the command with
//! `--tls-cert-file` and `--tls-key-file`, for its own connections and for the
//! lockers of `selfcheck`. Bad TLS options are usage errors. A failed TLS
//! connection names the file or name at fault: a v1 client certificate, a key
//! that is not the certificate's, a CA file that did not sign the server's
//! certificate, a host the certificate does not name, a client certificate the
//! server refuses. redis-cli's `--tls`, `--cacert`, `--cert` and `--key` work.

mod support;

use std::cell::Cell;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use lockflight::{Locker, RedisBackend};
use support::{args, lockflight_with_env};
use testkit::cluster::Node;
use testkit::unique_prefix;

/// A CA, a server certificate (for `IP:127.0.0.1`) and a client certificate
/// signed by it, as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("lockflight-tls-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("a temporary directory for the certificates");
        let pki = Pki { dir };
        pki.ca("ca");
        pki.leaf(
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        pki.leaf("client", "extendedKeyUsage=clientAuth\n");
        pki
    }

    /// A CA of its own: `<name>.key` and `<name>.crt` (self-signed, CA:TRUE).
    fn ca(&self, name: &str) {
        let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &crt,
            "-days",
            "3650",
            "-subj",
            &format!("/CN=lockflight test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
    }

    /// `<name>.key` and `<name>.crt`, signed by the CA with these extensions.
    fn leaf(&self, name: &str, extensions: &str) {
        self.leaf_signed_by(name, "ca", Some(extensions));
    }

    /// `<name>.key` and `<name>.crt`, signed by the CA `ca`; without
    /// `extensions`, an X.509 v1 certificate (`openssl x509 -req` writes v1
    /// when given no extensions).
    fn leaf_signed_by(&self, name: &str, ca: &str, extensions: Option<&str>) {
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN=lockflight test {name}"),
        ]);
        let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
        let mut sign = vec![
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-set_serial",
            "2",
            "-days",
            "3650",
            "-out",
            &crt,
        ];
        let ext = format!("{name}.ext");
        if let Some(extensions) = extensions {
            std::fs::write(
                self.dir.path().join(&ext),
                format!("basicConstraints=CA:FALSE\n{extensions}"),
            )
            .unwrap();
            sign.extend(["-extfile", &ext]);
        }
        self.openssl(&sign);
    }

    fn openssl(&self, arguments: &[&str]) {
        let out = Command::new("openssl")
            .args(arguments)
            .current_dir(self.dir.path())
            .output()
            .expect("run openssl (it must be on PATH)");
        assert!(
            out.status.success(),
            "openssl {arguments:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `path(name)` as a string argument.
    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

/// A redis-server with a TLS port (besides its plain one, which the harness's
/// startup check uses) serving the PKI's server certificate; with
/// `client_certs`, it requires a client certificate signed by the CA. Returns it
/// with its `rediss://` URL.
fn tls_server(pki: &Pki, client_certs: bool) -> (Node, String) {
    let tls_port = Cell::new(0);
    let node = Node::start(None, |_| {
        // A fresh port on each attempt (the harness retries on a port conflict).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        tls_port.set(port);
        [
            "--save",
            "",
            "--appendonly",
            "no",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &pki.arg("server.crt"),
            "--tls-key-file",
            &pki.arg("server.key"),
            "--tls-ca-cert-file",
            &pki.arg("ca.crt"),
            "--tls-auth-clients",
            if client_certs { "yes" } else { "no" },
        ]
        .map(str::to_owned)
        .to_vec()
    });
    let url = format!("rediss://127.0.0.1:{}/", tls_port.get());
    (node, url)
}

/// Runs the command; returns its exit code, its JSON report and its stderr.
async fn run(list: &[&str]) -> (i32, serde_json::Value, String) {
    let ((code, report), stderr) = lockflight_with_env(args(list), Vec::new()).await;
    (code, report, stderr)
}

/// The test certificates as the redis crate takes them (the client certificate
/// too, with `client`).
fn certificates(pki: &Pki, client: bool) -> redis::TlsCertificates {
    let read = |name: &str| std::fs::read(pki.path(name)).unwrap();
    redis::TlsCertificates {
        client_tls: client.then(|| redis::ClientTlsConfig {
            client_cert: read("client.crt"),
            client_key: read("client.key"),
        }),
        root_cert: Some(read("ca.crt")),
    }
}

/// A locker on `url` over TLS, under `prefix`, leases of 30 s.
async fn tls_locker(url: &str, certs: redis::TlsCertificates, prefix: &str) -> Locker {
    let client = redis::Client::build_with_tls(url, certs).unwrap();
    let backend = RedisBackend::from_client(client)
        .prefix(prefix)
        .connect()
        .await
        .unwrap();
    Locker::builder(backend)
        .lease_ttl(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_connects_with_the_ca_and_refuses_an_untrusted_certificate() {
    let pki = Pki::new();
    let (_server, url) = tls_server(&pki, false);
    let ca = pki.arg("ca.crt");

    let (code, report, stderr) = run(&["doctor", "--json", "--tls-ca-file", &ca, &url]).await;
    assert_eq!(code, 0, "{report:#}\n{stderr}");
    for id in ["version", "scripts", "acl", "script-publish"] {
        assert_eq!(support::verdict(&report, id).0, "pass", "{id}: {report:#}");
    }

    // Without the CA, the server's certificate is not trusted: a connection
    // error that says so and names the option, not a panic.
    let (code, report, stderr) = run(&["doctor", "--json", &url]).await;
    assert_eq!(code, 3, "{report:#}\n{stderr}");
    assert!(
        stderr.contains("certificate") && stderr.contains("--tls-ca-file"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_list_and_release_a_key_held_over_tls() {
    let pki = Pki::new();
    let (_server, url) = tls_server(&pki, false);
    let ca = pki.arg("ca.crt");
    let prefix = unique_prefix("cli-tls");
    let holder = tls_locker(&url, certificates(&pki, false), &prefix).await;
    let stuck = holder.lock("job").await.unwrap();

    let inspect = [
        "inspect",
        "--json",
        "--prefix",
        &prefix,
        "--tls-ca-file",
        &ca,
        &url,
        "job",
    ];
    let (code, report, stderr) = run(&inspect).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["held"], true, "{report:#}");
    assert_eq!(
        report["mutex"]["fence_epoch"],
        stuck.fencing_token().epoch,
        "{report:#}"
    );

    let (code, listing, stderr) = run(&[
        "list",
        "--json",
        "--prefix",
        &prefix,
        "--tls-ca-file",
        &ca,
        &url,
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(listing["keys"][0]["key"], "job", "{listing:#}");

    let (code, report, stderr) = run(&[
        "release",
        "--force",
        "--yes",
        "--json",
        "--prefix",
        &prefix,
        "--tls-ca-file",
        &ca,
        &url,
        "job",
    ])
    .await;
    assert_eq!(code, 0, "{report:#}\n{stderr}");
    assert_eq!(
        report["told"], 1,
        "the holder's instance is told: {report:#}"
    );

    let (code, report, stderr) = run(&inspect).await;
    assert_eq!(code, 0, "{stderr}");
    assert_ne!(report["held"], true, "{report:#}");
    tokio::time::timeout(Duration::from_secs(15), stuck.lost())
        .await
        .expect("the holder is told its lease is lost");
    let other = tls_locker(&url, certificates(&pki, false), &prefix).await;
    let next = tokio::time::timeout(Duration::from_secs(15), other.lock("job"))
        .await
        .expect("the key is free again")
        .unwrap();
    assert!(next.fencing_token() > stuck.fencing_token());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_requires_client_certificates_accepts_the_given_one() {
    let pki = Pki::new();
    let (_server, url) = tls_server(&pki, true);
    let ca = pki.arg("ca.crt");

    let (code, report, stderr) = run(&["doctor", "--json", "--tls-ca-file", &ca, &url]).await;
    assert_eq!(code, 3, "no client certificate: {report:#}\n{stderr}");
    assert!(stderr.contains("--tls-cert-file"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let (cert, key) = (pki.arg("client.crt"), pki.arg("client.key"));
    let with_cert = [
        "--tls-ca-file",
        ca.as_str(),
        "--tls-cert-file",
        cert.as_str(),
        "--tls-key-file",
        key.as_str(),
    ];
    let mut doctor = vec!["doctor", "--json"];
    doctor.extend(with_cert);
    doctor.push(url.as_str());
    let (code, report, stderr) = run(&doctor).await;
    assert_eq!(code, 0, "{report:#}\n{stderr}");
    assert_eq!(support::verdict(&report, "scripts").0, "pass", "{report:#}");

    // The library connects with the client certificate too, and the command
    // sees its key.
    let prefix = unique_prefix("cli-tls-mtls");
    let holder = tls_locker(&url, certificates(&pki, true), &prefix).await;
    let held = holder.lock("job").await.unwrap();
    let mut inspect = vec!["inspect", "--json", "--prefix", &prefix];
    inspect.extend(with_cert);
    inspect.extend([url.as_str(), "job"]);
    let (code, report, stderr) = run(&inspect).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["held"], true, "{report:#}");
    held.release().await.unwrap();

    // selfcheck's own lockers connect with the client certificate; its phases
    // through a fault proxy need plain TCP and are reported as not run.
    let mut selfcheck = vec!["selfcheck", "--json", "--seconds", "5"];
    selfcheck.extend(with_cert);
    selfcheck.push(url.as_str());
    let (code, report, stderr) = run(&selfcheck).await;
    assert_eq!(code, 0, "{report:#}\n{stderr}");
    for id in ["exclusion", "truthful-release", "nothing-left-locked"] {
        assert_eq!(support::verdict(&report, id).0, "pass", "{id}: {report:#}");
    }
    assert_eq!(
        support::verdict(&report, "lost-replies").0,
        "warn",
        "{report:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_options_are_usage_errors_that_name_the_file() {
    let pki = Pki::new();
    let url = "rediss://127.0.0.1:1/";
    let ca = pki.arg("ca.crt");
    let cert = pki.arg("client.crt");

    // A certificate without its key, and a key without its certificate.
    let (code, _, stderr) = run(&["doctor", "--tls-cert-file", &cert, url]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--tls-key-file"), "{stderr}");
    let key = pki.arg("client.key");
    let (code, _, stderr) = run(&["doctor", "--tls-key-file", &key, url]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--tls-cert-file"), "{stderr}");

    // A missing file, and a file that holds no certificate.
    let missing = pki.arg("missing.crt");
    let (code, _, stderr) = run(&["doctor", "--tls-ca-file", &missing, url]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains(&missing), "{stderr}");
    let not_pem = pki.arg("client.ext");
    let (code, _, stderr) = run(&["doctor", "--tls-ca-file", &not_pem, url]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&not_pem) && stderr.contains("CERTIFICATE"),
        "{stderr}"
    );
    // The key file given as the certificate.
    let (code, _, stderr) = run(&[
        "doctor",
        "--tls-cert-file",
        &key,
        "--tls-key-file",
        &key,
        url,
    ])
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains(&key), "{stderr}");

    // TLS options with a plain redis:// URL.
    let (code, _, stderr) = run(&["doctor", "--tls-ca-file", &ca, "redis://127.0.0.1:1/"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("rediss://"), "{stderr}");
}

/// Runs the command; returns its exit code and its stderr, which must not show
/// a panic.
async fn stderr_of(list: &[&str]) -> (i32, String) {
    let (code, _, stderr) = run(list).await;
    assert!(!stderr.contains("panicked"), "{stderr}");
    (code, stderr)
}

/// rustls takes only X.509 v3 certificates (webpki: `UnsupportedCertVersion`):
/// a v1 client certificate is named at startup, with its file, not taken for an
/// untrusted server certificate once connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_client_certificate_is_named_before_connecting() {
    let pki = Pki::new();
    pki.leaf_signed_by("v1client", "ca", None);
    let (_server, url) = tls_server(&pki, true);
    let (ca, cert, key) = (
        pki.arg("ca.crt"),
        pki.arg("v1client.crt"),
        pki.arg("v1client.key"),
    );
    let (code, stderr) = stderr_of(&[
        "doctor",
        "--tls-ca-file",
        &ca,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        &url,
    ])
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("--tls-cert-file {cert}")) && stderr.contains("X.509 v1"),
        "{stderr}"
    );
    assert!(!stderr.contains("server's certificate"), "{stderr}");
}

/// A key that is not the client certificate's is named with both files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_the_certificates_is_named() {
    let pki = Pki::new();
    let (cert, key) = (pki.arg("client.crt"), pki.arg("server.key"));
    let (code, stderr) = stderr_of(&[
        "doctor",
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "rediss://127.0.0.1:1/",
    ])
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--tls-key-file {key} is not the key of --tls-cert-file {cert}"
        )),
        "{stderr}"
    );
}

/// A CA file that did not sign the server's certificate is named, with what it
/// holds; a file that holds no CA at all (the server's own certificate) is told
/// apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_file_that_did_not_sign_the_servers_certificate_is_named() {
    let pki = Pki::new();
    pki.ca("other-ca");
    let (_server, url) = tls_server(&pki, false);

    let other = pki.arg("other-ca.crt");
    let (code, stderr) = stderr_of(&["doctor", "--tls-ca-file", &other, &url]).await;
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains(&format!("not signed by a CA of --tls-ca-file {other}"))
            && stderr.contains("issued by CN=lockflight test ca")
            && stderr.contains("it holds CN=lockflight test other-ca"),
        "{stderr}"
    );

    let leaf = pki.arg("server.crt");
    let (code, stderr) = stderr_of(&["doctor", "--tls-ca-file", &leaf, &url]).await;
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--tls-ca-file {leaf}, which holds no CA certificate"
        )),
        "{stderr}"
    );
}

/// A host the server's certificate does not name is the fault, not the CA: the
/// message names the host and the certificate's subjectAltName.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_the_servers_certificate_does_not_name_is_named() {
    let pki = Pki::new();
    let (_server, url) = tls_server(&pki, false);
    let by_name = url.replace("127.0.0.1", "localhost");
    let ca = pki.arg("ca.crt");
    let (code, stderr) = stderr_of(&["doctor", "--tls-ca-file", &ca, &by_name]).await;
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("not valid for localhost, the URL's host")
            && stderr.contains("subjectAltName names")
            && stderr.contains("127.0.0.1"),
        "{stderr}"
    );
    assert!(!stderr.contains("give the CA"), "{stderr}");
}

/// A client certificate the server does not accept (signed by a CA it does not
/// trust) is named as refused by the server, not as the server's certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_the_server_refuses_is_named() {
    let pki = Pki::new();
    pki.ca("other-ca");
    pki.leaf_signed_by(
        "stranger",
        "other-ca",
        Some("extendedKeyUsage=clientAuth\n"),
    );
    let (_server, url) = tls_server(&pki, true);
    let (ca, cert, key) = (
        pki.arg("ca.crt"),
        pki.arg("stranger.crt"),
        pki.arg("stranger.key"),
    );
    let (code, stderr) = stderr_of(&[
        "doctor",
        "--tls-ca-file",
        &ca,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        &url,
    ])
    .await;
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the server refused the client certificate of --tls-cert-file {cert}"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("server's certificate"), "{stderr}");
}

/// redis-cli's spellings: `--tls` makes a redis:// URL rediss://, and `--cacert`,
/// `--cert`, `--key` are --tls-ca-file, --tls-cert-file, --tls-key-file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_tls_flags_are_accepted() {
    let pki = Pki::new();
    let (_server, url) = tls_server(&pki, true);
    let plain = url.replace("rediss://", "redis://");
    let (ca, cert, key) = (
        pki.arg("ca.crt"),
        pki.arg("client.crt"),
        pki.arg("client.key"),
    );
    let (code, report, stderr) = run(&[
        "doctor", "--json", "--tls", "--cacert", &ca, "--cert", &cert, "--key", &key, &plain,
    ])
    .await;
    assert_eq!(code, 0, "{report:#}\n{stderr}");
    assert_eq!(support::verdict(&report, "scripts").0, "pass", "{report:#}");

    // Without --tls, a redis:// URL with TLS files is still a usage error.
    let (code, stderr) = stderr_of(&["doctor", "--cacert", &ca, &plain]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("redis:// ones with --tls"), "{stderr}");
}
