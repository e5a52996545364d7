//! TFRecord framing, the container of TensorBoard's event files: each record is its length as a
//! u64 (little-endian), the masked CRC32C of those 8 bytes as a u32, the data, and the masked
//! CRC32C of the data.

/// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), one byte at a time over a table built at
/// compile time: a record is a few hundred bytes a logged step, so speed is no concern.
pub fn crc32c(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut crc = i as u32;
            let mut bit = 0;
            while bit < 8 {
                crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
                bit += 1;
            }
            table[i] = crc;
            i += 1;
        }
        table
    };
    !bytes.iter().fold(!0u32, |crc, &b| TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8))
}

/// The CRC as TFRecord stores it: rotated right by 15 bits plus a constant (a CRC of data that
/// holds CRCs is weak otherwise).
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let crc = crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// `data` framed as one record.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}
