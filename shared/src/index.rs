//! The gather index protocol: an INT32 table where an entry `>= 0` names a
//! source token and [`PAD`] asks for a zero token.

/// Index-table value that means "write a zero token" (padding).
pub const PAD: i32 = -1;

/// Why an index table was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexError {
    /// An entry is neither [`PAD`] nor in `0..n_src`.
    OutOfRange {
        /// Position of the entry in the table.
        position: usize,
        /// The entry.
        value: i32,
        /// Number of source tokens.
        n_src: usize,
    },
}

/// Checks that every entry is [`PAD`] or a valid source token.
pub fn validate(table: &[i32], n_src: usize) -> Result<(), IndexError> {
    for (position, &value) in table.iter().enumerate() {
        let ok = value == PAD || (value >= 0 && (value as usize) < n_src);
        if !ok {
            return Err(IndexError::OutOfRange {
                position,
                value,
                n_src,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_pad_and_range() {
        assert_eq!(validate(&[0, PAD, 4], 5), Ok(()));
        assert_eq!(validate(&[], 0), Ok(()));
    }

    #[test]
    fn rejects_out_of_range_and_other_negatives() {
        assert_eq!(
            validate(&[0, 5], 5),
            Err(IndexError::OutOfRange {
                position: 1,
                value: 5,
                n_src: 5
            })
        );
        assert_eq!(
            validate(&[-2], 5),
            Err(IndexError::OutOfRange {
                position: 0,
                value: -2,
                n_src: 5
            })
        );
    }
}
