//! Everything the host knows about kernels, derived from the device
//! crate's one list ([`wavefuse_device::for_each_kernel`]): the [`Kernel`]
//! ids the backends load and dispatch, and one typed launch function per
//! entry point in [`launch`]. A pointer parameter takes an [`In`] or
//! [`Out`] of the kernel's element type, made only from a view of the
//! right element type and mutability; a scalar parameter takes exactly the
//! kernel's type. An op that passes arguments the kernel does not take does
//! not compile.
use crate::Result;
use crate::backend::Arg;
use crate::buffer::{Access, Tracker};
use std::marker::PhantomData;

/// A device address for a kernel's `*const T` parameter, with the
/// wavefuse buffer it points into (if any), which a launch on a foreign
/// stream keeps alive until that work is done.
pub(crate) struct In<'a, T> {
    pub addr: u64,
    pub owner: Option<&'a Tracker>,
    _t: PhantomData<*const T>,
}

/// [`In`] for a kernel's `*mut T` parameter.
pub(crate) struct Out<'a, T> {
    pub addr: u64,
    pub owner: Option<&'a Tracker>,
    _t: PhantomData<*mut T>,
}

// Not derived: the derives would require `T: Copy`.
impl<T> Clone for In<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for In<'_, T> {}
impl<T> Clone for Out<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Out<'_, T> {}

impl<'a, T> In<'a, T> {
    pub fn new(addr: u64, owner: Option<&'a Tracker>) -> Self {
        In {
            addr,
            owner,
            _t: PhantomData,
        }
    }

    /// A null pointer, for an optional input the kernel does not read.
    pub fn null() -> Self {
        In::new(0, None)
    }

    /// The address `n` elements further, the same owner (a null argument
    /// stays null).
    pub fn offset(self, n: usize) -> Self {
        if self.addr == 0 {
            return self;
        }
        In::new(self.addr + (n * size_of::<T>()) as u64, self.owner)
    }
}

impl<'a, T> Out<'a, T> {
    pub fn new(addr: u64, owner: Option<&'a Tracker>) -> Self {
        Out {
            addr,
            owner,
            _t: PhantomData,
        }
    }

    /// The address `n` elements further, the same owner.
    pub fn offset(self, n: usize) -> Self {
        Out::new(self.addr + (n * size_of::<T>()) as u64, self.owner)
    }
}

/// How a kernel parameter type is passed from the host.
pub(crate) trait Param {
    type Host<'a>: Copy;
    fn arg(h: &Self::Host<'_>) -> Arg;
    /// The wavefuse buffer the argument points into, and how the kernel
    /// uses it.
    fn owner<'a>(h: &Self::Host<'a>) -> Option<(&'a Tracker, Access)>;
}

impl<T> Param for *const T {
    type Host<'a> = In<'a, T>;
    fn arg(h: &In<'_, T>) -> Arg {
        Arg::Ptr(h.addr)
    }
    fn owner<'a>(h: &Self::Host<'a>) -> Option<(&'a Tracker, Access)> {
        h.owner.map(|t| (t, Access::Read))
    }
}

impl<T> Param for *mut T {
    type Host<'a> = Out<'a, T>;
    fn arg(h: &Out<'_, T>) -> Arg {
        Arg::Ptr(h.addr)
    }
    fn owner<'a>(h: &Self::Host<'a>) -> Option<(&'a Tracker, Access)> {
        h.owner.map(|t| (t, Access::Write))
    }
}

macro_rules! scalar_params {
    ($($t:ty => $v:ident),*) => {$(
        impl Param for $t {
            type Host<'a> = $t;
            fn arg(h: &$t) -> Arg {
                Arg::$v(*h)
            }
            fn owner<'a>(_: &Self::Host<'a>) -> Option<(&'a Tracker, Access)> {
                None
            }
        }
    )*};
}
scalar_params!(u64 => U64, u32 => U32, f32 => F32);

macro_rules! registry {
    ($($name:ident($($a:ident: $t:ty),* $(,)?);)*) => {
        /// A kernel entry point.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Kernel {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                $name,
            )*
        }

        impl Kernel {
            /// Every kernel, in registry order (`k as usize` indexes it).
            pub const ALL: &'static [Kernel] = &[$(Kernel::$name),*];

            /// The entry point's symbol.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Kernel::$name => stringify!($name),)*
                }
            }
        }

        /// Every kernel entry point's symbol, in registry order.
        pub const KERNELS: &[&str] = &[$(stringify!($name)),*];

        /// One typed launch function per kernel.
        #[allow(clippy::too_many_arguments, dead_code)]
        pub(crate) mod launch {
            use super::*;
            use crate::backend::Launch;
            use crate::device::Stream;
            $(
                /// # Safety
                /// Every pointer must be valid for what the kernel touches
                /// with these scalars (the op checked the extents).
                pub unsafe fn $name(q: &Stream, l: Launch, $($a: <$t as Param>::Host<'_>),*) -> Result<()> {
                    let args = [$(<$t as Param>::arg(&$a)),*];
                    let owners = [$(<$t as Param>::owner(&$a)),*];
                    // SAFETY: caller contract; the arguments match the
                    // kernel's parameters by construction.
                    unsafe { q.launch(Kernel::$name, l, &args, &owners) }
                }
            )*
        }
    };
}
wavefuse_device::for_each_kernel!(registry);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_index_the_list() {
        assert_eq!(Kernel::ALL.len(), KERNELS.len());
        for (i, k) in Kernel::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
            assert_eq!(k.name(), KERNELS[i]);
        }
        let mut names = KERNELS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KERNELS.len(), "duplicate kernel names");
    }
}
