//! Arguments from Python to Rust values, refused with `InvalidInput`
//! (never a `TypeError` or a panic): names, keys and values must be `str`
//! that UTF-8 can hold (a lone surrogate cannot), numbers must fit.
//!
//! Whether a name is acceptable (empty, too long, control characters) is
//! the library's decision: any `str` goes through to it.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

use crate::errors::Failure;

/// Longest part of a refused value quoted in a message.
const SHOWN_CHARS: usize = 64;

/// `value` as a `String`; `what` names it in the error ("lock name").
///
/// # Errors
/// [`Failure::Invalid`] for anything but a `str`, or a `str` with a lone
/// surrogate.
pub(crate) fn text(value: &Bound<'_, PyAny>, what: &str) -> Result<String, Failure> {
    let Ok(text) = value.cast::<PyString>() else {
        return Err(Failure::Invalid(format!(
            "the {what} must be a str, not {}",
            type_name(value)
        )));
    };
    match text.to_str() {
        Ok(text) => Ok(text.to_owned()),
        Err(_) => Err(Failure::Invalid(format!(
            "the {what} cannot be encoded as UTF-8 (it holds a lone surrogate)"
        ))),
    }
}

/// `value` as an integer in `0..=max` (`u16`, `u32`, …); `describe` makes
/// the error from its problem.
///
/// # Errors
/// [`Failure::Invalid`], by `describe`, for a `bool`, a non-integer or an
/// integer out of range.
pub(crate) fn integer<T>(
    value: &Bound<'_, PyAny>,
    describe: impl Fn(String) -> Failure,
) -> Result<T, Failure>
where
    T: TryFrom<u64> + std::fmt::Display + Bounded,
{
    // `True` is an `int` in Python, and almost surely a mistake here.
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(describe(format!(
            "expected an integer, got {}",
            type_name(value)
        )));
    }
    let out_of_range = || describe(format!("must be between 0 and {}", T::MAX));
    let wide: u64 = value.extract().map_err(|_| out_of_range())?;
    T::try_from(wide).map_err(|_| out_of_range())
}

/// The largest value of an unsigned integer type.
pub(crate) trait Bounded {
    /// It.
    const MAX: Self;
}

impl Bounded for u16 {
    const MAX: Self = u16::MAX;
}

impl Bounded for u32 {
    const MAX: Self = u32::MAX;
}

/// The name of `value`'s type, for messages.
pub(crate) fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|name| name.to_string())
        .unwrap_or_else(|_| "an object of unknown type".into())
}

/// `text` cut to a message's worth, quoted.
pub(crate) fn shown(text: &str) -> String {
    let mut shown: String = text.chars().take(SHOWN_CHARS).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    format!("{shown:?}")
}
