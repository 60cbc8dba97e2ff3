//! The front doors: each binding's buffers and streams as the core's
//! [`DeviceView`](crate::DeviceView)s and [`LaunchStream`](crate::LaunchStream)s.
//! The core itself (validation, planning, launch) sees only device
//! addresses and driver handles, through the run-time loaded driver
//! ([`crate::driver`]); the raw door is [`DeviceView::from_raw`](crate::DeviceView::from_raw)
//! and [`RawStream`](crate::RawStream).

#[cfg(feature = "cudarc")]
pub(crate) mod cudarc;
#[cfg(feature = "cust")]
pub(crate) mod cust;
