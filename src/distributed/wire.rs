//! The frames ranks exchange over their TCP connections: a tag byte, a little-endian u64 length
//! and the payload. Control frames carry JSON; data frames carry raw little-endian numbers.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// The first bytes of every hello: a stray connection (a port scanner, another program using
/// MASTER_PORT) is told apart from a rank.
pub const MAGIC: &str = "lora-ft-rendezvous-1";

/// Frames above this are garbage, not a gradient bucket (those are ~25 MB).
const MAX_FRAME: u64 = 1 << 33;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: String,
    pub version: String,
    pub rank: usize,
    pub world_size: usize,
    /// "cpu" or "nccl": every rank must use the same collective.
    pub backend: String,
    /// What every rank must agree on (the run's config, its device left out).
    pub run: serde_json::Value,
}

/// Rank 0's answer once every rank has joined: the payload (the NCCL unique id), or why the run
/// cannot start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    pub error: Option<String>,
    pub payload: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedMsg {
    pub rank: usize,
    pub what: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Hello(Hello),
    Welcome(Welcome),
    Heartbeat,
    Data(Vec<u8>),
    /// A rank failed (itself, or as rank 0 heard it): every rank stops.
    Failed(FailedMsg),
    /// The sender is done: its connection closing next is not a failure.
    Bye,
}

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const HEARTBEAT: u8 = 3;
const DATA: u8 = 4;
const FAILED: u8 = 5;
const BYE: u8 = 6;

pub fn write_frame(w: &mut impl Write, frame: &Frame) -> io::Result<()> {
    let (tag, json) = match frame {
        Frame::Hello(h) => (HELLO, to_json(h)),
        Frame::Welcome(m) => (WELCOME, to_json(m)),
        Frame::Failed(f) => (FAILED, to_json(f)),
        Frame::Heartbeat => (HEARTBEAT, Vec::new()),
        Frame::Data(_) => (DATA, Vec::new()),
        Frame::Bye => (BYE, Vec::new()),
    };
    // a gradient bucket is written as it is, not copied into a JSON body
    let body = if let Frame::Data(d) = frame { d.as_slice() } else { json.as_slice() };
    let mut head = [0u8; 9];
    head[0] = tag;
    head[1..].copy_from_slice(&(body.len() as u64).to_le_bytes());
    w.write_all(&head)?;
    w.write_all(body)?;
    w.flush()
}

fn to_json(v: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(v).expect("control frames serialize")
}

pub fn read_frame(r: &mut impl Read) -> io::Result<Frame> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head)?;
    let len = u64::from_le_bytes(head[1..].try_into().expect("8 bytes"));
    if len > MAX_FRAME {
        return Err(invalid(format!("a frame of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    Ok(match head[0] {
        HELLO => Frame::Hello(parse(&body)?),
        WELCOME => Frame::Welcome(parse(&body)?),
        HEARTBEAT => Frame::Heartbeat,
        DATA => Frame::Data(body),
        FAILED => Frame::Failed(parse(&body)?),
        BYE => Frame::Bye,
        tag => return Err(invalid(format!("unknown frame tag {tag}"))),
    })
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    serde_json::from_slice(body).map_err(|e| invalid(e.to_string()))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// f32 values as little-endian bytes, and back.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn bytes_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()
}

pub fn f64_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn bytes_f64(bytes: &[u8]) -> Vec<f64> {
    bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let hello = Hello {
            magic: MAGIC.into(),
            version: "0.1.0".into(),
            rank: 3,
            world_size: 4,
            backend: "cpu".into(),
            run: serde_json::json!({"train": {"lr": 1e-3}}),
        };
        let frames = [
            Frame::Hello(hello),
            Frame::Welcome(Welcome { error: None, payload: vec![1, 2, 255] }),
            Frame::Heartbeat,
            Frame::Data(f32_bytes(&[1.5, -0.0, f32::INFINITY])),
            Frame::Failed(FailedMsg { rank: 1, what: "out of memory".into() }),
            Frame::Bye,
        ];
        let mut buf = Vec::new();
        for f in &frames {
            write_frame(&mut buf, f).unwrap();
        }
        let mut r = buf.as_slice();
        for f in &frames {
            assert_eq!(&read_frame(&mut r).unwrap(), f);
        }
        assert!(r.is_empty());
        assert_eq!(bytes_f32(&f32_bytes(&[1.5, -2.25])), [1.5, -2.25]);
        assert_eq!(bytes_f64(&f64_bytes(&[1e300, -0.5])), [1e300, -0.5]);
    }

    #[test]
    fn garbage_is_an_error_not_an_allocation() {
        let mut huge = vec![DATA];
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        let err = read_frame(&mut huge.as_slice()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let err = read_frame(&mut b"GET / HTTP/1.1\r\n\r\n".as_slice()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }
}
