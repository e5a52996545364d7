//! (being written this session)
