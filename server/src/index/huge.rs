//! A fixed-size array of plain values in its own anonymous mapping, which the kernel may back with
//! 2 MiB pages: where a sealed graph keeps its rows and links.
//!
//! Why: a search of a graph bigger than the CPU's caches reads a few thousand rows at random, and
//! with 4 KiB pages nearly every row also misses the TLB, so its load waits for a page walk before
//! it can even start. A million f16 rows of 384 dimensions are 768 MB: 190,000 small pages, but
//! 370 huge ones, which the TLB covers. Linux gives an anonymous mapping huge pages when it is
//! advised to (`MADV_HUGEPAGE`) in its `madvise` THP mode, which many distributions set and this
//! machine has, and anyway in `always`; the heap's allocations are never advised. Under `never`,
//! on other systems, or when the kernel declines, it is ordinary memory.
//!
//! An array never grows or shrinks: it is made at its final size (zeroed, or copied from a slice),
//! for memory written once and then read, as a sealed segment's is.

use std::fmt;
use std::ops::{Deref, DerefMut};

use bytemuck::Pod;
use memmap2::MmapMut;

/// A huge page (x86-64, arm64 with 4 KiB pages). Below this many bytes an array stays on the heap:
/// a huge page would cover all of it and more.
const MAPPED_FROM: usize = 2 << 20;

/// `len` values of `T`, zeroed when made, in memory advised for huge pages when large enough.
pub(super) struct Huge<T: Pod> {
    memory: Memory<T>,
}

enum Memory<T> {
    Heap(Vec<T>),
    /// `len` values from its start (page-aligned, so aligned for `T`), then up to a huge page of
    /// bytes never used.
    Mapped {
        map: MmapMut,
        len: usize,
    },
}

impl<T: Pod> Huge<T> {
    /// `len` zeroed values. A mapping that cannot be made falls back to the heap: the array is the
    /// same, only its pages are small.
    pub(super) fn zeroed(len: usize) -> Self {
        let bytes = len.saturating_mul(size_of::<T>());
        if bytes >= MAPPED_FROM {
            // Anonymous mappings are zero-filled by the kernel, and not touched until written. A
            // whole number of huge pages: Linux aligns only such a mapping to a huge page, and an
            // unaligned one gets huge pages only where whole ones fit inside it.
            let mapped = bytes.div_ceil(MAPPED_FROM).saturating_mul(MAPPED_FROM);
            if let Ok(map) = MmapMut::map_anon(mapped) {
                #[cfg(target_os = "linux")]
                if let Err(err) = map.advise(memmap2::Advice::HugePage) {
                    tracing::debug!(error = %err, "huge pages not advised for an index array");
                }
                return Self {
                    memory: Memory::Mapped { map, len },
                };
            }
        }
        Self {
            memory: Memory::Heap(vec![T::zeroed(); len]),
        }
    }

    /// A copy of `values`.
    pub(super) fn from_slice(values: &[T]) -> Self {
        let mut huge = Self::zeroed(values.len());
        huge.copy_from_slice(values);
        huge
    }

    /// Whether the values are in a mapping of their own (advised for huge pages on Linux).
    pub(super) fn is_mapped(&self) -> bool {
        matches!(self.memory, Memory::Mapped { .. })
    }
}

impl<T: Pod> Deref for Huge<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.memory {
            Memory::Heap(values) => values,
            Memory::Mapped { map, len } => bytemuck::cast_slice(&map[..len * size_of::<T>()]),
        }
    }
}

impl<T: Pod> DerefMut for Huge<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.memory {
            Memory::Heap(values) => values,
            Memory::Mapped { map, len } => {
                bytemuck::cast_slice_mut(&mut map[..*len * size_of::<T>()])
            }
        }
    }
}

impl<T: Pod + PartialEq> PartialEq for Huge<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Pod> fmt::Debug for Huge<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Huge")
            .field("len", &self.len())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_arrays_stay_on_the_heap_and_large_ones_are_mapped() {
        let small = Huge::<u32>::from_slice(&[1, 2, 3]);
        assert!(!small.is_mapped());
        assert_eq!(&*small, &[1, 2, 3]);
        let len = MAPPED_FROM / 4 + 5;
        let mut large = Huge::<u32>::zeroed(len);
        assert!(large.is_mapped());
        assert_eq!(large.len(), len);
        assert!(large.iter().all(|v| *v == 0));
        large[len - 1] = 7;
        large[0] = 9;
        let copy = Huge::from_slice(&large);
        assert_eq!(copy, large);
        assert_eq!((copy[0], copy[len - 1]), (9, 7));
        assert_eq!(Huge::<u32>::zeroed(0).len(), 0);
    }
}
