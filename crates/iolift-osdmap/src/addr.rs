//! Network addresses as an OSDMap carries them (`entity_addr_t`,
//! `entity_addrvec_t`), decoded for reports and printed as Ceph prints
//! them: `v2:127.0.0.1:6800/8959`, `[v2:...,v1:...]`.

use crate::codec::Reader;
use crate::Result;
use std::fmt;

/// `entity_addr_t` types.
pub const ADDR_NONE: u32 = 0;
pub const ADDR_LEGACY: u32 = 1;
pub const ADDR_MSGR2: u32 = 2;
pub const ADDR_ANY: u32 = 3;

/// One address: type, nonce and the socket address (family and bytes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Addr {
    pub addr_type: u32,
    pub nonce: u32,
    pub family: u16,
    /// Port in host order.
    pub port: u16,
    /// 4 bytes for IPv4, 16 for IPv6, empty otherwise.
    pub ip: Vec<u8>,
}

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

fn sockaddr(family: u16, data: &[u8], a: &mut Addr) {
    a.family = family;
    if data.len() >= 2 {
        a.port = u16::from_be_bytes([data[0], data[1]]);
    }
    match family {
        AF_INET if data.len() >= 6 => a.ip = data[2..6].to_vec(),
        // sin6_flowinfo (4 bytes) precedes the address
        AF_INET6 if data.len() >= 22 => a.ip = data[6..22].to_vec(),
        _ => {}
    }
}

impl Addr {
    /// `entity_addr_t::decode`: marker 0 is the legacy fixed layout,
    /// 1 the versioned one.
    pub fn read(r: &mut Reader, field: &str) -> Result<Addr> {
        let at = r.offset();
        match r.u8(field)? {
            0 => {
                r.take(3, field)?;
                let nonce = r.u32(field)?;
                let ss = r.take(128, field)?;
                let family = u16::from_be_bytes([ss[0], ss[1]]);
                let mut a = Addr {
                    addr_type: ADDR_LEGACY,
                    nonce,
                    ..Addr::default()
                };
                if family != 0 {
                    sockaddr(family, &ss[2..], &mut a);
                } else {
                    a.addr_type = ADDR_NONE;
                }
                Ok(a)
            }
            1 => {
                let (_, _, mut s) = r.header(field)?;
                let mut a = Addr {
                    addr_type: s.u32(field)?,
                    nonce: s.u32(field)?,
                    ..Addr::default()
                };
                let len = s.u32(field)? as usize;
                if len >= 2 {
                    let family = s.u16(field)?;
                    let data = s.take(len - 2, field)?;
                    sockaddr(family, data, &mut a);
                } else {
                    s.take(len, field)?;
                }
                Ok(a)
            }
            m => Err(r.corrupt(at, field, format!("address marker {m}"))),
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.addr_type == ADDR_NONE {
            return f.write_str("-");
        }
        match self.addr_type {
            ADDR_LEGACY => f.write_str("v1:")?,
            ADDR_MSGR2 => f.write_str("v2:")?,
            ADDR_ANY => {}
            _ => f.write_str("???:")?,
        }
        match self.family {
            AF_INET if self.ip.len() == 4 => {
                let ip = std::net::Ipv4Addr::new(self.ip[0], self.ip[1], self.ip[2], self.ip[3]);
                write!(f, "{ip}:{}", self.port)?;
            }
            AF_INET6 if self.ip.len() == 16 => {
                let b: [u8; 16] = self.ip.clone().try_into().expect("16 bytes");
                write!(f, "[{}]:{}", std::net::Ipv6Addr::from(b), self.port)?;
            }
            _ => f.write_str("(unrecognized address family 0)")?,
        }
        write!(f, "/{}", self.nonce)
    }
}

/// `entity_addrvec_t`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AddrVec(pub Vec<Addr>);

impl AddrVec {
    pub fn read(r: &mut Reader, field: &str) -> Result<AddrVec> {
        let at = r.offset();
        match r.peek_u8(field)? {
            0 | 1 => Ok(AddrVec(vec![Addr::read(r, field)?])),
            2 => {
                r.u8(field)?;
                let n = r.count(field, 1)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(Addr::read(r, field)?);
                }
                Ok(AddrVec(v))
            }
            m => Err(r.corrupt(at, field, format!("address vector marker {m}"))),
        }
    }

    /// A `u32` count of vectors.
    pub fn read_list(r: &mut Reader, field: &str) -> Result<Vec<AddrVec>> {
        let n = r.count(field, 1)?;
        (0..n).map(|_| AddrVec::read(r, field)).collect()
    }
}

impl fmt::Display for AddrVec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.len() {
            0 => Ok(()),
            1 => write!(f, "{}", self.0[0]),
            _ => {
                f.write_str("[")?;
                for (i, a) in self.0.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str("]")
            }
        }
    }
}
