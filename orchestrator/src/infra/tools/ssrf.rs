//! The SSRF guard for fetching arbitrary URLs: private, loopback, link-local, metadata and other
//! non-public addresses are refused unless allow-listed. It is enforced after DNS resolution (a
//! resolver that drops refused addresses, so every connection, redirects included, goes through
//! it) and on IP-literal URLs and every redirect hop (which never reach a resolver).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// An address block: `10.0.0.0/8`, `::1/128`, or a single address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpBlock {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl std::str::FromStr for IpBlock {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, p) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not an IP address or CIDR block"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{s}`: prefix must be 0..={max}"))?,
        };
        Ok(Self { addr, prefix })
    }
}

impl IpBlock {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(self.prefix))
                };
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(self.prefix))
                };
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// IPv4-mapped IPv6 addresses are judged as the IPv4 address they carry (IPv4-compatible,
/// 6to4 and Teredo addresses are refused outright in `v6_reason`).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// Why an address is refused, or `None` when it is public.
pub fn non_public_reason(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => v6_reason(v6),
    }
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        Some("link-local (includes cloud metadata 169.254.169.254)")
    } else if ip.is_unspecified() || o[0] == 0 {
        Some("unspecified / this-network")
    } else if ip.is_broadcast() || ip.is_multicast() {
        Some("broadcast or multicast")
    } else if o[0] == 100 && (64..128).contains(&o[1]) {
        Some("carrier-grade NAT (100.64.0.0/10)")
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        Some("IETF protocol assignments (192.0.0.0/24)")
    } else if o[0] == 198 && (o[1] == 18 || o[1] == 19) {
        Some("benchmarking (198.18.0.0/15)")
    } else if o[0] >= 240 {
        Some("reserved (240.0.0.0/4)")
    } else if ip.is_documentation() {
        Some("documentation range")
    } else {
        None
    }
}

fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    let seg = ip.segments();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if seg[0] & 0xfe00 == 0xfc00 {
        Some("unique local (fc00::/7)")
    } else if seg[0] & 0xffc0 == 0xfe80 {
        Some("link-local (fe80::/10)")
    } else if seg[0] == 0x2001 && seg[1] == 0x0db8 {
        Some("documentation (2001:db8::/32)")
    } else if seg[0] == 0x0064 && seg[1] == 0xff9b {
        Some("NAT64 (64:ff9b::/96) may reach private IPv4")
    } else if seg[..6].iter().all(|&x| x == 0) {
        // ::a.b.c.d (IPv4-compatible, deprecated); ::1 and :: are handled above.
        Some("IPv4-compatible (::/96, deprecated) may reach any IPv4")
    } else if seg[0] == 0x2002 {
        Some("6to4 (2002::/16) tunnels to an embedded IPv4 address")
    } else if seg[0] == 0x2001 && seg[1] == 0 {
        Some("Teredo (2001::/32) tunnels to an embedded IPv4 address")
    } else if seg[0] & 0xffc0 == 0xfec0 {
        Some("site-local (fec0::/10, deprecated)")
    } else {
        None
    }
}

/// Host names that are refused before resolution (cloud metadata services).
const METADATA_HOSTS: &[&str] = &[
    "metadata.google.internal",
    "metadata",
    "instance-data",
    "metadata.azure.com",
];

/// The policy: refuse non-public addresses except those in `allow`.
#[derive(Debug, Clone, Default)]
pub struct AddressGuard {
    pub allow: Vec<IpBlock>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("refused {target}: {reason}; allow-list it explicitly to permit")]
    Refused { target: String, reason: String },
    #[error("refused {url}: only http and https URLs may be fetched")]
    Scheme { url: String },
    #[error("{url} has no host")]
    NoHost { url: String },
    #[error("cannot resolve {host}: {message}")]
    Resolve { host: String, message: String },
}

impl AddressGuard {
    pub fn new(allow: Vec<IpBlock>) -> Arc<Self> {
        Arc::new(Self { allow })
    }

    pub fn check_ip(&self, ip: IpAddr) -> Result<(), GuardError> {
        if self.allow.iter().any(|b| b.contains(ip)) {
            return Ok(());
        }
        match non_public_reason(ip) {
            Some(reason) => Err(GuardError::Refused {
                target: ip.to_string(),
                reason: reason.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Check a URL before it is requested (and at every redirect): scheme, metadata host names,
    /// and IP-literal hosts. Host names are checked again after resolution by [`GuardedResolver`].
    pub fn check_url(&self, url: &url::Url) -> Result<(), GuardError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(GuardError::Scheme {
                url: url.to_string(),
            });
        }
        match url.host() {
            None => Err(GuardError::NoHost {
                url: url.to_string(),
            }),
            Some(url::Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip)),
            Some(url::Host::Domain(d)) => {
                let d = d.trim_end_matches('.').to_ascii_lowercase();
                if METADATA_HOSTS.contains(&d.as_str()) {
                    return Err(GuardError::Refused {
                        target: d,
                        reason: "cloud metadata host".into(),
                    });
                }
                Ok(())
            }
        }
    }

    /// Resolve a host and keep only permitted addresses; none left is an error naming why.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, GuardError> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| GuardError::Resolve {
                host: host.to_string(),
                message: e.to_string(),
            })?
            .collect();
        let mut refused = None;
        let ok: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| match self.check_ip(a.ip()) {
                Ok(()) => true,
                Err(e) => {
                    refused = Some(e);
                    false
                }
            })
            .collect();
        match (ok.is_empty(), refused) {
            (true, Some(GuardError::Refused { reason, .. })) => Err(GuardError::Refused {
                target: format!("{host} (resolves to a non-public address)"),
                reason,
            }),
            (true, _) => Err(GuardError::Resolve {
                host: host.to_string(),
                message: "no addresses".into(),
            }),
            (false, _) => Ok(ok),
        }
    }
}

/// A reqwest DNS resolver that only ever hands out permitted addresses.
pub struct GuardedResolver(pub Arc<AddressGuard>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.0.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs = guard
                .resolve(&host, 0)
                .await
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: &str) -> bool {
        AddressGuard::default()
            .check_ip(s.parse().unwrap())
            .is_err()
    }

    #[test]
    fn non_public_addresses_are_refused() {
        for ip in [
            "127.0.0.1",
            "127.5.5.5",
            "10.0.0.1",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.9.9",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::",
            "64:ff9b::a00:1",
            "::127.0.0.1",
            "::10.0.0.1",
            "2002:7f00:1::1",
            "2002:a00:1::",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "fec0::1",
        ] {
            assert!(refused(ip), "{ip} must be refused");
        }
        for ip in ["93.184.216.34", "8.8.8.8", "172.32.0.1", "2606:4700::1111"] {
            assert!(!refused(ip), "{ip} is public");
        }
    }

    #[test]
    fn allow_list_and_cidr() {
        let g = AddressGuard {
            allow: vec![
                "127.0.0.2/32".parse().unwrap(),
                "10.1.0.0/16".parse().unwrap(),
            ],
        };
        assert!(g.check_ip("127.0.0.2".parse().unwrap()).is_ok());
        assert!(g.check_ip("127.0.0.1".parse().unwrap()).is_err());
        assert!(g.check_ip("10.1.200.3".parse().unwrap()).is_ok());
        assert!(g.check_ip("10.2.0.1".parse().unwrap()).is_err());
        assert!("10.0.0.0/33".parse::<IpBlock>().is_err());
        assert!("nope".parse::<IpBlock>().is_err());
    }

    #[test]
    fn urls() {
        let g = AddressGuard::default();
        let check = |u: &str| g.check_url(&url::Url::parse(u).unwrap());
        assert!(check("http://169.254.169.254/latest/meta-data").is_err());
        assert!(check("http://[::1]:8080/").is_err());
        assert!(check("http://metadata.google.internal/").is_err());
        assert!(check("file:///etc/passwd").is_err());
        assert!(check("https://example.org/").is_ok());
        let e = check("http://10.0.0.1/").unwrap_err().to_string();
        assert!(e.contains("10.0.0.1") && e.contains("private"), "{e}");
    }
}
