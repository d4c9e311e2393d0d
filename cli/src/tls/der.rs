//! The few facts about an X.509 certificate that a TLS diagnosis names: its
//! version, its subject and issuer, and whether it is a CA. Read from the DER
//! with a minimal reader (tag, length, contents); the signature, the validity and
//! every other field are rustls's to check, not this module's.

/// What a diagnosis says about one certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CertFacts {
    /// 1, 2 or 3 (X.509 v1 has no version field).
    pub(crate) version: u8,
    /// The subject as `CN=…, O=…` (the attributes this reader knows).
    pub(crate) subject: String,
    /// The issuer, written as the subject is.
    pub(crate) issuer: String,
    /// The subject's DER (a `Name`, with its SEQUENCE header).
    pub(crate) subject_der: Vec<u8>,
    /// The issuer's DER.
    pub(crate) issuer_der: Vec<u8>,
    /// basicConstraints `cA` is true.
    pub(crate) is_ca: bool,
}

impl CertFacts {
    /// Reads a certificate's DER; `None` if it is not an X.509 certificate.
    pub(crate) fn read(der: &[u8]) -> Option<CertFacts> {
        let (certificate, _) = expect(der, SEQUENCE)?;
        let (tbs, _) = expect(certificate, SEQUENCE)?;
        let (mut version, mut rest) = (1, tbs);
        if let Some((explicit, after)) = expect(rest, VERSION) {
            let (number, _) = expect(explicit, INTEGER)?;
            version = number.last().copied().unwrap_or(0).checked_add(1)?;
            rest = after;
        }
        let (_serial, rest) = expect(rest, INTEGER)?;
        let (_algorithm, rest) = expect(rest, SEQUENCE)?;
        let issuer_der = element(rest)?;
        let (issuer, rest) = expect(rest, SEQUENCE)?;
        let (_validity, rest) = expect(rest, SEQUENCE)?;
        let subject_der = element(rest)?;
        let (subject, mut rest) = expect(rest, SEQUENCE)?;
        let (_key, after) = expect(rest, SEQUENCE)?;
        rest = after;
        let mut is_ca = false;
        while let Some((tag, contents, after)) = tlv(rest) {
            if tag == EXTENSIONS {
                is_ca = basic_constraints_ca(contents).unwrap_or(false);
            }
            rest = after;
        }
        Some(CertFacts {
            version,
            subject: name(subject),
            issuer: name(issuer),
            subject_der: subject_der.to_vec(),
            issuer_der: issuer_der.to_vec(),
            is_ca,
        })
    }
}

/// A distinguished name's DER (with or without its SEQUENCE header, as a TLS
/// CertificateRequest may list it) written as [`CertFacts::subject`] is.
pub(crate) fn name_of(der: &[u8]) -> String {
    match expect(der, SEQUENCE) {
        Some((contents, [])) => name(contents),
        _ => name(der),
    }
}

/// A `Name`'s DER without its SEQUENCE header, with its SEQUENCE header.
pub(crate) fn with_header(der: &[u8]) -> Vec<u8> {
    match expect(der, SEQUENCE) {
        Some((_, [])) => der.to_vec(),
        _ => {
            let mut out = vec![SEQUENCE];
            let len = der.len();
            if len < 0x80 {
                out.push(len as u8);
            } else {
                let bytes: Vec<u8> = len
                    .to_be_bytes()
                    .into_iter()
                    .skip_while(|&b| b == 0)
                    .collect();
                out.push(0x80 | bytes.len() as u8);
                out.extend(bytes);
            }
            out.extend_from_slice(der);
            out
        }
    }
}

const INTEGER: u8 = 0x02;
const OCTET_STRING: u8 = 0x04;
const BOOLEAN: u8 = 0x01;
const OID: u8 = 0x06;
const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
/// `[0] EXPLICIT Version`.
const VERSION: u8 = 0xA0;
/// `[3] EXPLICIT Extensions`.
const EXTENSIONS: u8 = 0xA3;
/// 2.5.29.19, basicConstraints.
const BASIC_CONSTRAINTS: &[u8] = &[0x55, 0x1D, 0x13];

/// The attributes a name is written with, by OID (2.5.4.x).
const ATTRIBUTES: &[(&[u8], &str)] = &[
    (&[0x55, 0x04, 0x03], "CN"),
    (&[0x55, 0x04, 0x0A], "O"),
    (&[0x55, 0x04, 0x0B], "OU"),
    (&[0x55, 0x04, 0x06], "C"),
];

/// The first element of `input`: its tag, its contents and what follows it.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7F);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The first element of `input` if its tag is `tag`: its contents and the rest.
fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (found, contents, rest) = tlv(input)?;
    (found == tag).then_some((contents, rest))
}

/// The whole first element of `input` (header and contents).
fn element(input: &[u8]) -> Option<&[u8]> {
    let (_, _, rest) = tlv(input)?;
    Some(&input[..input.len() - rest.len()])
}

/// Whether the extensions (`[3]`'s contents) hold basicConstraints with `cA`
/// true; `None` if they are malformed.
fn basic_constraints_ca(explicit: &[u8]) -> Option<bool> {
    let (mut extensions, _) = expect(explicit, SEQUENCE)?;
    while let Some((extension, rest)) = expect(extensions, SEQUENCE) {
        extensions = rest;
        let (oid, mut fields) = expect(extension, OID)?;
        if oid != BASIC_CONSTRAINTS {
            continue;
        }
        if let Some((_critical, after)) = expect(fields, BOOLEAN) {
            fields = after;
        }
        let (value, _) = expect(fields, OCTET_STRING)?;
        let (constraints, _) = expect(value, SEQUENCE)?;
        return Some(expect(constraints, BOOLEAN).is_some_and(|(ca, _)| ca.first() == Some(&0xFF)));
    }
    Some(false)
}

/// A `Name`'s contents (a SEQUENCE of SETs of attributes) as `CN=…, O=…`;
/// attributes of other types are left out (`?` if none is known).
fn name(mut rdns: &[u8]) -> String {
    let mut parts = Vec::new();
    while let Some((set, rest)) = expect(rdns, SET) {
        rdns = rest;
        let mut attributes = set;
        while let Some((attribute, rest)) = expect(attributes, SEQUENCE) {
            attributes = rest;
            let Some((oid, value)) = expect(attribute, OID) else {
                continue;
            };
            let Some((_, text, _)) = tlv(value) else {
                continue;
            };
            if let Some((_, label)) = ATTRIBUTES.iter().find(|(known, _)| *known == oid) {
                parts.push(format!("{label}={}", String::from_utf8_lossy(text)));
            }
        }
    }
    if parts.is_empty() {
        "?".to_owned()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;

    use super::{CertFacts, name_of, with_header};

    /// `openssl req -x509 … -addext basicConstraints=critical,CA:TRUE`.
    const CA: &str = "\
-----BEGIN CERTIFICATE-----
MIIBljCCATugAwIBAgIUbCjgU+IE+fyPcEcAOap3zftPbi0wCgYIKoZIzj0EAwIw
GDEWMBQGA1UEAwwNbG9ja2ZsaWdodCBjYTAeFw0yNjExMjgyMjA3MDBaFw0zNjEx
MjUyMjA3MDBaMBgxFjAUBgNVBAMMDWxvY2tmbGlnaHQgY2EwWTATBgcqhkjOPQIB
BggqhkjOPQMBBwNCAAQd0Hh5Ci0iEQ/lzf3OtE4qiupmhW7I+k/dj3Sx6/Efdu26
/O4qNKM7IfkHyzkbkWA9CA6guBZJ6nsTpLu4mqsho2MwYTAdBgNVHQ4EFgQUaYLY
tHb9TJD8NMZyd+gvfbS2akUwHwYDVR0jBBgwFoAUaYLYtHb9TJD8NMZyd+gvfbS2
akUwDwYDVR0TAQH/BAUwAwEB/zAOBgNVHQ8BAf8EBAMCAQYwCgYIKoZIzj0EAwID
SQAwRgIhAJKUhPGFcTzP/+b1kfStzowUs8QRhW/1dUOk9GQxROg5AiEA1pZGZic3
YPRLkYl5q1xaiGZtBOYNGodRivCLJ1CgitY=
-----END CERTIFICATE-----";
    /// `openssl x509 -req` without extensions: X.509 v1, signed by `CA`.
    const V1: &str = "\
-----BEGIN CERTIFICATE-----
MIIBHDCBxAIBAzAKBggqhkjOPQQDAjAYMRYwFAYDVQQDDA1sb2NrZmxpZ2h0IGNh
MB4XDTI2MTEyODIyMDcwMFoXDTM2MTEyNTIyMDcwMFowHjEcMBoGA1UEAwwTbG9j
a2ZsaWdodCB2MWNsaWVudDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABA40vmmt
2lf6iUadF5L1NMb+TiJtc1FGqMIMk/78EKLfLzaYJGvseCFI4vHLgbQ37Kf1hGpf
DObxWEK7wXJ4M6UwCgYIKoZIzj0EAwIDRwAwRAIgOTl4cX/ISjnylhHgbyimnTc5
j9FgMyydrsErt2eg8d0CIHWBcnE+o9zlAffLhhKrdyYhFE8PUGKF77bsqx1zhrDV
-----END CERTIFICATE-----";
    /// Signed by `CA`, with basicConstraints CA:FALSE and a subjectAltName.
    const SERVER: &str = "\
-----BEGIN CERTIFICATE-----
MIIBlTCCATygAwIBAgIBAjAKBggqhkjOPQQDAjAYMRYwFAYDVQQDDA1sb2NrZmxp
Z2h0IGNhMB4XDTI2MTEyODIyMDcwMFoXDTM2MTEyNTIyMDcwMFowHDEaMBgGA1UE
AwwRbG9ja2ZsaWdodCBzZXJ2ZXIwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAARn
H7cOFWXRzKDP0nDi1sJaQD82IrWsszplyjXqbn9oCZpn5rjMJm0skbPW27zpPWHe
J8U4j6BhLKOvo9Hu6Tn+o3MwcTAJBgNVHRMEAjAAMA8GA1UdEQQIMAaHBH8AAAEw
EwYDVR0lBAwwCgYIKwYBBQUHAwEwHQYDVR0OBBYEFBszlOEBFEkr5xvTi4fI2jmh
0ciFMB8GA1UdIwQYMBaAFGmC2LR2/UyQ/DTGcnfoL320tmpFMAoGCCqGSM49BAMC
A0cAMEQCIAXSBKvrtXGXSIDbg28mToufHiCRt1JLmBfKEL74BgmwAiAvyYlpwka9
2JkgWLz3tkeBZi626xJa3M8AwJaZpfKuDQ==
-----END CERTIFICATE-----";

    fn facts(pem: &str) -> CertFacts {
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM certificate");
        CertFacts::read(&der).expect("an X.509 certificate")
    }

    #[test]
    fn a_certificate_reads_its_version_names_and_ca_flag() {
        let ca = facts(CA);
        assert_eq!((ca.version, ca.is_ca), (3, true));
        assert_eq!(ca.subject, "CN=lockflight ca");
        assert_eq!(ca.subject_der, ca.issuer_der, "self-signed");

        let v1 = facts(V1);
        assert_eq!((v1.version, v1.is_ca), (1, false));
        assert_eq!(v1.subject, "CN=lockflight v1client");
        assert_eq!(v1.issuer_der, ca.subject_der);

        let server = facts(SERVER);
        assert_eq!((server.version, server.is_ca), (3, false));
        assert_eq!(server.issuer, "CN=lockflight ca");
    }

    #[test]
    fn a_name_reads_with_or_without_its_header() {
        let ca = facts(CA);
        assert_eq!(name_of(&ca.subject_der), "CN=lockflight ca");
        let contents = &ca.subject_der[2..];
        assert_eq!(name_of(contents), "CN=lockflight ca");
        assert_eq!(with_header(contents), ca.subject_der);
        assert_eq!(with_header(&ca.subject_der), ca.subject_der);
        assert_eq!(CertFacts::read(b"not a certificate"), None);
    }
}
