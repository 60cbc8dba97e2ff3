//! The cudarc door: `CudaSlice`/`CudaView`/`CudaViewMut` as device views and
//! `CudaStream` as a launch stream. cudarc orders each slice's reads and
//! writes across streams with events; a call takes its slices' pointers on
//! its own stream ([`StreamOrder`](crate::stream::StreamOrder)) and holds
//! them until its kernels are launched, as cudarc's own launches do.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};

use crate::memory::{DeviceView, DeviceViewMut, Read, Write};
use crate::stream::sealed::{LaunchOn, Sealed};

macro_rules! read {
    ($($memory:ty),*) => {$(
        impl<T> Read for $memory {
            fn read_on<'g>(&'g self, stream: &'g CudaStream) -> SyncOnDrop<'g> {
                self.device_ptr(stream).1
            }
        }
    )*};
}
read!(CudaSlice<T>, CudaView<'_, T>);

macro_rules! write {
    ($($memory:ty),*) => {$(
        impl<T> Write for $memory {
            fn write_on<'g>(&'g mut self, stream: &'g CudaStream) -> SyncOnDrop<'g> {
                self.device_ptr_mut(stream).1
            }
        }
    )*};
}
write!(CudaSlice<T>, CudaViewMut<'_, T>);

/// A view of `memory`, whose address is taken on the memory's own stream
/// (the call orders it on the call's stream again at launch).
fn view<'a, T, M: DevicePtr<T> + DeviceSlice<T> + Read + 'a>(memory: &'a M) -> DeviceView<'a, T> {
    let (addr, _record) = memory.device_ptr(memory.stream());
    DeviceView { addr, len: memory.len(), cudarc: Some(memory), _memory: std::marker::PhantomData }
}

fn view_mut<'a, T, M: DevicePtrMut<T> + DeviceSlice<T> + Write + 'a>(memory: &'a mut M) -> DeviceViewMut<'a, T> {
    let stream = memory.stream().clone();
    let (addr, record) = memory.device_ptr_mut(&stream);
    drop(record);
    let len = memory.len();
    DeviceViewMut { addr, len, cudarc: Some(memory), _memory: std::marker::PhantomData }
}

impl<'a, T: 'a> From<&'a CudaSlice<T>> for DeviceView<'a, T> {
    fn from(slice: &'a CudaSlice<T>) -> Self {
        view(slice)
    }
}

impl<'a, T: 'a> From<&'a CudaView<'_, T>> for DeviceView<'a, T> {
    fn from(slice: &'a CudaView<'_, T>) -> Self {
        view(slice)
    }
}

impl<'a, T: 'a> From<&'a mut CudaSlice<T>> for DeviceViewMut<'a, T> {
    fn from(slice: &'a mut CudaSlice<T>) -> Self {
        view_mut(slice)
    }
}

impl<'a, T: 'a> From<&'a mut CudaViewMut<'_, T>> for DeviceViewMut<'a, T> {
    fn from(slice: &'a mut CudaViewMut<'_, T>) -> Self {
        view_mut(slice)
    }
}

impl Sealed for CudaStream {
    fn launch_on(&self) -> LaunchOn<'_> {
        LaunchOn { raw: self.cu_stream().cast(), cudarc: Some(self), _stream: std::marker::PhantomData }
    }
}

impl Sealed for Arc<CudaStream> {
    fn launch_on(&self) -> LaunchOn<'_> {
        (**self).launch_on()
    }
}
