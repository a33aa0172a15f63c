//! airlock-images: OCI images as cell roots. References pinned by digest, a
//! content-addressed store under the state directory that checks every blob against its
//! digest before use, and a layer unpacker that never follows anything a layer controls.

mod digest;
mod error;
pub mod import;
pub mod layout;
pub mod merged;
pub mod oci;
mod reference;
pub mod registry;
pub mod store;
pub mod unpack;

pub use digest::{Digest, HashingReader};
pub use error::{ImageError, Result};
pub use reference::ImageRef;
pub use store::{GcReport, ImageRecord, ImageStore, LayerRecord, Lease};
pub use unpack::{unpack_layer, Limits, Unpacked};
